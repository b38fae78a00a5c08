"""deepspeed.comm's calls on zero's process group (the one zero.initialize
trains over): init_distributed, get_rank, get_world_size, all_reduce,
broadcast, all_gather_into_tensor, barrier. Host (CPU) tensors on CPU ranks.
The launch environment is torchrun's (zero-run and torchrun both set it)."""
import sys

from . import _C

_group = None


def _exiting_on_error(kind, value, traceback, previous=sys.excepthook):
    """An uncaught exception ends the program: the interpreter still tears
    the process group down, and rank 0 need not keep the rendezvous store
    up for ranks that wait in a collective it will never join (Note
    [Exiting on an error], comm/exit_on_error.h)."""
    _C.exiting_on_error()
    previous(kind, value, traceback)


sys.excepthook = _exiting_on_error


def init_distributed(dist_backend=None, **kwargs):
    """Joins the job's ranks (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). A
    second call returns; zero.initialize calls it when nobody has."""
    global _group
    if kwargs:
        raise NotImplementedError(f"zero.comm.init_distributed: {', '.join(sorted(kwargs))} not supported; "
                                  "zero reads the launch environment")
    if _group is None:
        _group = _C.init_process_group()
    return _group


def is_initialized():
    return _group is not None


def _world():
    if _group is None:
        raise RuntimeError("zero.comm: call zero.comm.init_distributed() or zero.initialize() first")
    return _group


def get_rank(group=None):
    return (group or _world()).rank


def get_world_size(group=None):
    return (group or _world()).size


def all_reduce(tensor, op="sum", group=None):
    """In place, as torch.distributed.all_reduce. op: "sum", "avg" or "max"."""
    (group or _world()).all_reduce(tensor, str(op).lower().split(".")[-1])


def broadcast(tensor, src, group=None):
    (group or _world()).broadcast(tensor, src)


def all_gather_into_tensor(output, input, group=None):
    (group or _world()).all_gather(output, input)


def barrier(group=None):
    (group or _world()).barrier()
