"""zero from Python: DeepSpeed's calls over zero's C++ engine.

    engine, optimizer, _, lr_scheduler = zero.initialize(model=model, model_parameters=model.parameters(),
                                                          config="ds_config.json")
    for batch in batches:
        loss = engine(batch).loss
        engine.backward(loss)
        engine.step()

The model is any torch.nn.Module (transformers' LlamaForCausalLM, your
own). The engine trains the model's own parameter tensors: zero's C++
engine holds them (python/csrc/python_model.h, Note [The mirror]), so the
model's forward runs unchanged in Python and everything after it (gradient
reduction, partitioning, offload, the optimizer step) runs in C++. A
DeepSpeed call or argument zero cannot honour raises, naming it.
"""
import torch

from . import _build

__version__ = _build.zero_version  # the project's (CMakeLists.txt), as deepspeed.__version__

# zero._C links the LibTorch of one torch version: beside any other, its
# tensors would not be torch's (or it would not load at all).
if torch.__version__ != _build.torch_version:
    raise ImportError(f"zero was built against torch {_build.torch_version}, but this Python imports torch "
                      f"{torch.__version__} ({torch.__file__}); rebuild zero beside this torch "
                      f"(pip install ./python, or ZERO_TORCH=wheel bash tools/build.sh)")

from . import _C  # noqa: E402
from . import comm  # noqa: E402
from ._C import CheckpointError, CommError, ConfigError, EngineError, Error, OffloadError, PartitionError  # noqa: E402
from .engine import Engine, GatheredParameters, initialize  # noqa: E402
from .init import Init  # noqa: E402

__all__ = ["initialize", "Engine", "GatheredParameters", "Init", "comm", "Error", "ConfigError", "CommError",
           "PartitionError", "OffloadError", "CheckpointError", "EngineError"]
