"""zero.Init: partitioned construction of a Python model, as
deepspeed.zero.Init. While it is open, each unit (an instance of one of the
classes `units` names) keeps only this rank's part of its trainable
parameters from the moment its __init__ returns (zero's C++ zero::Init,
include/zero/init.h), so no rank holds more than one unit whole beyond its
parts. zero.initialize then lays the parts out. The rules are zero::Init's:

- A unit sets its weights in its __init__. Between construction and
  initialize, a partitioned parameter keeps its shape over one value (a
  zero-stride view): writing into it raises. transformers' models write
  their weights again after construction (post_init): build them under
  transformers.initialization.no_init_weights() as well and load the
  weights after initialize (engine.load_weights), as from_pretrained does.
- Parameters outside every unit, frozen parameters and buffers are built
  whole; initialize partitions them.
- With the same seed, the weights initialize ends with are those of the
  model built whole (each unit is broadcast from rank 0 as it is taken).
"""
import functools

from . import _C, comm

# DeepSpeed's other arguments, accepted at their defaults only.
_DEFAULTS = {"data_parallel_group": None, "mem_efficient_linear": True, "pin_memory": False, "dtype": None,
             "mpu": None, "zero_param_parallel_group": None, "zero_quantized_weights": False,
             "zero_quantized_nontrainable_weights": False, "sequence_data_parallel_group": None,
             "param_swapper": None}


class Init:
    def __init__(self, module=None, config_dict_or_path=None, config=None, remote_device=None, enabled=True,
                 units=None, **deepspeed_arguments):
        from .engine import _read_config
        unknown = sorted(k for k in deepspeed_arguments if k not in _DEFAULTS)
        if unknown:
            raise TypeError(f"zero.Init: unexpected argument(s) {', '.join(unknown)}")
        changed = sorted(k for k, v in deepspeed_arguments.items() if v != _DEFAULTS[k])
        if module is not None:
            changed.insert(0, "module (partitioning a model built already)")
        if changed:
            raise NotImplementedError(f"zero.Init: {', '.join(changed)} not supported; the config's zero_optimization "
                                      "and offload_param sections say how to partition")
        self.enabled = enabled
        if not enabled:
            return
        if not units or not all(isinstance(u, type) for u in units):
            raise ValueError("zero.Init needs units=[the block classes] (e.g. transformers' LlamaDecoderLayer): each "
                             "instance is partitioned as its __init__ returns; zero.initialize takes the same units")
        self._config = _read_config(config_dict_or_path if config_dict_or_path is not None else config)
        self._remote_device = remote_device or ""
        self._units = list(units)
        self._parts = None
        self._originals = {}
        self._building = {}

    def __enter__(self):
        if not self.enabled:
            return self
        self._parts = _C.Init(self._config, self._remote_device, comm.init_distributed())
        for cls in self._units:
            self._originals[cls] = cls.__dict__.get("__init__")
            cls.__init__ = self._wrap(cls.__init__)
        return self

    def _wrap(self, original):
        @functools.wraps(original)
        def __init__(module, *args, **kwargs):
            # A unit class whose __init__ calls another unit class's (a
            # subclass): the module is taken once, when the outermost returns.
            self._building[id(module)] = self._building.get(id(module), 0) + 1
            try:
                original(module, *args, **kwargs)
            finally:
                self._building[id(module)] -= 1
            if self._building[id(module)] == 0:
                del self._building[id(module)]
                self._take(module)
        return __init__

    def _take(self, module):
        from .engine import _module_specs
        specs, _ = _module_specs(module, [])
        self._parts.take(specs)

    def __exit__(self, exc_type, exc, tb):
        if not self.enabled:
            return False
        for cls, original in self._originals.items():
            if original is None:
                del cls.__init__  # it was inherited
            else:
                cls.__init__ = original
        self._parts.close()
        if isinstance(exc, RuntimeError) and "single memory location" in str(exc):
            raise _C.EngineError(
                "zero.Init: a unit's parameter was written after the unit was built (partitioned, it holds no values "
                "until zero.initialize); set weights in the units' __init__. For a transformers model, build it under "
                "transformers.initialization.no_init_weights() too and load its weights after zero.initialize "
                "(engine.load_weights)") from exc
        return False
