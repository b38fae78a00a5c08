"""zero.initialize and the Engine: DeepSpeed's calls, zero's C++ engine."""
import functools
import json
import os
import weakref

import torch

from . import _C, comm


def _engine_of(param):
    """The engine that trains `param` (zero.GatheredParameters finds it on
    the parameter, as DeepSpeed keeps its ds_* attributes there)."""
    ref = getattr(param, "_zero_engine", None)
    return ref() if ref is not None else None


def _read_config(config):
    """A ds_config path or dict as text for zero's reader."""
    if config is None:
        raise ValueError("zero.initialize: no config; pass config= a ds_config path or dict")
    if isinstance(config, (str, os.PathLike)):
        with open(config) as f:
            return f.read()
    if isinstance(config, dict):
        return json.dumps(config)
    raise TypeError(f"zero.initialize: config is a {type(config).__name__}; pass a ds_config path or dict")


def _is_unit(choice, path, module):
    """Whether `units` (classes, class names, module paths or a predicate)
    picks this submodule."""
    if callable(choice) and not isinstance(choice, type):
        return bool(choice(path, module))
    for c in choice:
        if isinstance(c, type) and isinstance(module, c):
            return True
        if isinstance(c, str) and (type(module).__name__ == c or path == c):
            return True
    return False


def _default_units(model):
    """transformers' blocks: the classes a PreTrainedModel names in
    _no_split_modules (its decoder layers), which FSDP's auto-wrap and
    Accelerate also use as units."""
    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    return sorted(names)


def _module_specs(model, units):
    """The spec of each module of the model for the C++ mirror (Note [The
    mirror]), and the Python modules chosen as units, in that order.
    Non-persistent buffers (rotary inv_freq) are not the model's state: they
    stay out of checkpoints, as in torch's state_dict."""
    specs, unit_modules = [], []
    for path, module in model.named_modules():
        unit = bool(path) and _is_unit(units, path, module)
        params = [(n, p) for n, p in module._parameters.items() if p is not None]
        skip = getattr(module, "_non_persistent_buffers_set", set())
        buffers = [(n, b) for n, b in module._buffers.items() if b is not None and n not in skip]
        specs.append(_C.ModuleSpec(path, unit, params, buffers))
        if unit:
            unit_modules.append(module)
    return specs, unit_modules


def _param_groups(model, model_parameters):
    """DeepSpeed's model_parameters: None (every trainable parameter), an
    iterable of parameters, or of groups {"params": [...], "weight_decay": x}."""
    if model_parameters is None:
        return []
    items = list(model_parameters)
    if not items:
        raise ValueError("zero.initialize: model_parameters is empty")
    if all(isinstance(p, torch.Tensor) for p in items):
        return [_C.ParamGroupSpec(items, None)]
    groups = []
    for i, g in enumerate(items):
        if not isinstance(g, dict) or "params" not in g:
            raise TypeError(f"zero.initialize: model_parameters[{i}] is neither a parameter nor a group dict with 'params'")
        other = sorted(set(g) - {"params", "weight_decay", "name"})
        if other:
            raise NotImplementedError(f"zero.initialize: parameter group {i} sets {', '.join(other)}; zero's groups "
                                      "take their own weight_decay only (the rest comes from the ds_config)")
        params = g["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        groups.append(_C.ParamGroupSpec(params, g.get("weight_decay")))
    return groups


def _first_tensor(output):
    """The tensor of a unit's output whose gradient announces the unit's
    backward (its hidden states)."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for v in values:
        if isinstance(v, torch.Tensor) and v.requires_grad:
            return v
    return None


def _recomputed_in_backward(forward):
    """The config's activation_checkpointing.checkpoint_every for a Python
    unit: its forward under torch.utils.checkpoint (non-reentrant), keeping
    only its inputs. At stage 3 the recompute runs on the parameters the
    unit's backward gathered (the gradient of its output arrives first)."""
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)
    return run


class Engine:
    """DeepSpeed's engine over a Python model: engine(*inputs) runs the
    model's forward; backward, step, checkpoints and the rest run in C++."""

    def __init__(self, model, config, model_parameters=None, units=None, training_data=None, collate_fn=None):
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"zero.initialize: model is a {type(model).__name__}, not a torch.nn.Module")
        # The text as it is: zero's reader takes DeepSpeed's hjson
        # liberties (comments, trailing commas), which json.loads would not.
        config_text = _read_config(config)
        self.module = model
        self.config = config
        shapes = {id(p): (p.shape, p.numel()) for p in model.parameters()}
        group = comm.init_distributed()
        chosen = _default_units(model) if units is None else units
        specs, self._units = _module_specs(model, chosen)
        self._engine = _C.Engine(config_text, specs, _param_groups(model, model_parameters), group)
        self._dtype = {"Half": torch.float16, "BFloat16": torch.bfloat16}.get(self._engine.dtype(), torch.float32)
        self._auto_cast = self._engine.fp16_auto_cast() and self._dtype == torch.float16
        # Buffers kept out of the mirror (a rotary inv_freq) stay in fp32, as
        # DeepSpeed 0.19 keeps buffers, and become dp rank 0's, as initialize
        # makes the mirrored ones (DeepSpeed broadcasts every buffer).
        for module in model.modules():
            for name in getattr(module, "_non_persistent_buffers_set", ()):
                b = module._buffers.get(name)
                if b is not None:
                    self.dp_group.broadcast(b, 0)
        for k, unit in enumerate(self._units):
            if self._engine.unit_checkpoints(k):
                unit.forward = _recomputed_in_backward(unit.forward)
        self._hooks = []
        if self._engine.stage() == 3:
            for k, unit in enumerate(self._units):
                self._hooks.append(unit.register_forward_pre_hook(functools.partial(self._enter, k)))
                self._hooks.append(unit.register_forward_hook(functools.partial(self._leave, k)))
            self._guard_released(model)
        for p in model.parameters():
            p._zero_engine = weakref.ref(self)
            p.ds_shape, p.ds_numel = shapes[id(p)]  # DeepSpeed's names for a released parameter's real shape
        self.training_dataloader = None
        if training_data is not None:
            self.training_dataloader = self.deepspeed_io(training_data, collate_fn=collate_fn)

    # ---- units (stage 3): gathered before their forward, released after
    def _enter(self, k, module, args):
        self._engine.unit_enter(k)

    def _leave(self, k, module, args, output):
        self._engine.unit_leave(k, _first_tensor(output))

    def _guard_released(self, model):
        """A submodule of a unit called on its own while the unit is
        released would compute on parameters of 0 elements: its forward
        raises first, naming it (DeepSpeed's hooks gather any module; zero
        gathers units)."""
        inside = {}
        for k, unit in enumerate(self._units):
            for path, sub in unit.named_modules():
                if path and any(p is not None for p in sub._parameters.values()):
                    inside.setdefault(sub, k)
        names = {m: n for n, m in model.named_modules()}

        def check(module, args):
            for name, p in module._parameters.items():
                if p is not None and p.numel() == 0 and getattr(p, "ds_numel", 0) > 0:
                    unit = names[self._units[inside[module]]]
                    raise _C.EngineError(
                        f"zero: {names[module]} was called on its own while its unit {unit} is released (stage 3: "
                        f"{names[module]}.{name} holds 0 of its {p.ds_numel} elements); call it through {unit}, or "
                        f"inside zero.GatheredParameters({unit}.parameters())")
        for module in inside:
            self._hooks.append(module.register_forward_pre_hook(check))

    # ---- the training loop
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        if self._auto_cast:  # fp16.auto_cast: floating inputs in fp16, as DeepSpeed casts them
            cast = lambda v: v.half() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
            args = tuple(cast(a) for a in args)
            kwargs = {k: cast(v) for k, v in kwargs.items()}
        return self.module(*args, **kwargs)

    def backward(self, loss, retain_graph=False, scale_wrt_gas=True):
        if retain_graph or not scale_wrt_gas:
            raise NotImplementedError("engine.backward: retain_graph=True and scale_wrt_gas=False are not supported")
        self._check_no_new_parameters()
        self._engine.backward(loss)
        return loss

    def _check_no_new_parameters(self):
        """A parameter added after initialize is not in the engine's
        partition: it would never be updated. Named instead."""
        if all(getattr(p, "_zero_engine", None) is not None or not p.requires_grad for p in self.module.parameters()):
            return
        for name, p in self.module.named_parameters():
            if p.requires_grad and getattr(p, "_zero_engine", None) is None:
                raise _C.EngineError(f"zero: parameter {name} was added to the model after zero.initialize, so the "
                                     "engine does not train it; add it before initialize (or build a new engine)")

    def step(self, lr_kwargs=None):
        if lr_kwargs:
            raise NotImplementedError("engine.step: lr_kwargs is not supported")
        self._engine.step()

    def is_gradient_accumulation_boundary(self):
        return self._engine.is_gradient_accumulation_boundary()

    def train(self, mode=True):
        self.module.train(mode)
        self._engine.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def zero_grad(self):
        """step() clears the gradients at the boundary, as DeepSpeed's does."""

    # ---- DeepSpeed's accessors
    def get_lr(self):
        return [self._engine.get_lr()]

    def get_global_grad_norm(self):
        return self._engine.last_grad_norm() if self._engine.global_steps() > 0 else None

    @property
    def global_steps(self):
        return self._engine.global_steps()

    @property
    def skipped_steps(self):
        return self._engine.skipped_steps()

    @property
    def micro_steps(self):
        return self._engine.micro_steps()

    def loss_scale(self):
        return self._engine.loss_scale()

    def train_batch_size(self):
        return self._engine.train_batch_size()

    def train_micro_batch_size_per_gpu(self):
        return self._engine.train_micro_batch_size_per_gpu()

    def gradient_accumulation_steps(self):
        return self._engine.gradient_accumulation_steps()

    def set_gradient_clipping(self, max_norm):
        self._engine.set_gradient_clipping(float(max_norm))

    def memory_report(self):
        """Bytes this rank holds, by kind (zero's Engine::memory_report)."""
        return self._engine.memory_report()

    @property
    def dp_group(self):
        return self._engine.dp_group()

    # ---- checkpoints
    def save_checkpoint(self, save_dir, tag=None, client_state=None, save_latest=True, exclude_frozen_parameters=False):
        if not save_latest or exclude_frozen_parameters:
            raise NotImplementedError("engine.save_checkpoint: save_latest=False and exclude_frozen_parameters=True "
                                      "are not supported")
        try:
            state = json.dumps(client_state or {})
        except TypeError as e:
            raise TypeError(f"engine.save_checkpoint: client_state must be JSON (zero never pickles): {e}") from None
        self._engine.save_checkpoint(os.fspath(save_dir), "" if tag is None else str(tag), state)
        return True

    def load_checkpoint(self, load_dir, tag=None, load_module_strict=True, load_optimizer_states=True,
                        load_lr_scheduler_states=True, load_module_only=False, custom_load_fn=None):
        """DeepSpeed's return: (path, client_state), or (None, None) when
        there is no checkpoint to load."""
        if not load_module_strict or custom_load_fn is not None:
            raise NotImplementedError("engine.load_checkpoint: load_module_strict=False and custom_load_fn are not supported")
        tag = "" if tag is None else str(tag)
        state = self._engine.load_checkpoint(os.fspath(load_dir), tag, load_optimizer_states, load_lr_scheduler_states,
                                             load_module_only)
        if state is None:
            return None, None
        if not tag:
            with open(os.path.join(load_dir, "latest")) as f:
                tag = f.read().strip()
        return os.path.join(load_dir, tag), json.loads(state)

    def save_16bit_model(self, save_dir, save_filename="model.safetensors", exclude_frozen_parameters=False):
        if not save_filename.endswith(".safetensors") or exclude_frozen_parameters:
            raise NotImplementedError(f"engine.save_16bit_model: zero writes safetensors (name the file "
                                      f"model.safetensors, not {save_filename}) and keeps frozen parameters")
        return self._engine.save_16bit_model(os.fspath(save_dir), save_filename)

    def load_weights(self, path):
        """safetensors weights (a file, an index or a folder) into the
        partitioned model, each rank reading its own shards."""
        self._engine.load_weights(os.fspath(path))

    # ---- data
    def deepspeed_io(self, dataset, batch_size=None, collate_fn=None, shuffle=True, seed=0):
        """DeepSpeed's loader: this data-parallel rank's rows of each global
        batch (torch's DistributedSampler over the dp ranks)."""
        group = self.dp_group
        sampler = torch.utils.data.distributed.DistributedSampler(dataset, num_replicas=group.size, rank=group.rank,
                                                                  shuffle=shuffle, seed=seed)
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size or self.train_micro_batch_size_per_gpu(),
                                           sampler=sampler, collate_fn=collate_fn)

    def _gather(self, path, modifier_rank):
        return self._engine.gather(path, modifier_rank)

    def _path_of(self, params):
        """The innermost module path that holds all of `params`."""
        owner = {}
        for path, module in self.module.named_modules():
            for p in module._parameters.values():
                if p is not None:
                    owner.setdefault(id(p), path)
        paths = [owner.get(id(p)) for p in params]
        if any(p is None for p in paths):
            raise ValueError("zero.GatheredParameters: a tensor given is not a parameter of the engine's model")
        common = os.path.commonprefix([p.split(".") for p in paths])
        return ".".join(common)


class _Optimizer:
    """What initialize returns as the optimizer: the engine's, read-only
    (its param_groups' lr); step() and zero_grad() are the engine's."""

    def __init__(self, engine):
        self._engine = engine

    @property
    def param_groups(self):
        return [{"lr": self._engine.get_lr()[0]}]

    def step(self, *a, **k):
        raise NotImplementedError("call engine.step(): zero's optimizer steps inside it")

    def zero_grad(self, *a, **k):
        pass


class _Scheduler:
    """The config's "scheduler" as initialize returns it (get_last_lr)."""

    def __init__(self, engine):
        self._engine = engine

    def get_last_lr(self):
        return [self._engine._engine.lr()]

    def step(self, *a, **k):
        raise NotImplementedError("engine.step() steps the ds_config's scheduler")


def initialize(args=None, model=None, optimizer=None, model_parameters=None, training_data=None, lr_scheduler=None,
               distributed_port=None, mpu=None, dist_init_required=None, collate_fn=None, config=None,
               mesh_param=None, config_params=None, units=None):
    """deepspeed.initialize: returns (engine, optimizer, training_dataloader,
    lr_scheduler). units (zero's): the submodules stage 3 gathers and
    releases as a whole: classes, class names, module paths, or a predicate
    (path, module) -> bool; default: the classes transformers names in
    _no_split_modules (each decoder layer)."""
    refused = [name for name, value in (("args", args), ("optimizer", optimizer), ("lr_scheduler", lr_scheduler),
                                        ("mpu", mpu), ("mesh_param", mesh_param), ("distributed_port", distributed_port))
               if value is not None]
    if refused:
        raise NotImplementedError(f"zero.initialize: {', '.join(refused)} not supported from Python: the optimizer and "
                                  "scheduler come from the ds_config's sections, the config from config=")
    if model is None:
        raise ValueError("zero.initialize: model= is required")
    engine = Engine(model, config if config is not None else config_params, model_parameters, units, training_data,
                    collate_fn)
    scheduler = _Scheduler(engine) if engine._engine.has_scheduler() else None
    return engine, _Optimizer(engine), engine.training_dataloader, scheduler


class GatheredParameters:
    """deepspeed.zero.GatheredParameters: with it, the parameters given (of
    one engine's model) are whole on every rank; with modifier_rank, that
    rank's changes become every rank's when it ends. A collective. Outside
    stage 3, or with enabled=False, it gathers nothing."""

    def __init__(self, params, modifier_rank=None, fwd_module=None, enabled=True):
        params = [params] if isinstance(params, torch.Tensor) else [p for p in params if p is not None]
        self._engine = next((e for e in map(_engine_of, params) if e is not None), None) if enabled else None
        if enabled and params and self._engine is None:
            raise ValueError("zero.GatheredParameters: the parameters given belong to no zero engine")
        self._params = params
        self._modifier = modifier_rank
        self._held = None

    def __enter__(self):
        if self._engine is not None:
            self._held = self._engine._gather(self._engine._path_of(self._params), self._modifier)
        return self

    def __exit__(self, *exc):
        if self._held is not None:
            self._held.release()
            self._held = None
        return False
