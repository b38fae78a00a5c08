"""Rank 0 raises after two steps while rank 1 waits in a barrier: the run
of error_exits_fast.sh."""
import torch

import zero
from test_api import Block, config, toy, train

model = toy()
engine, *_ = zero.initialize(model=model, config=config(3), units=[Block])
train(engine, model, 2)
if zero.comm.get_rank() == 0:
    raise RuntimeError("a mistake on rank 0, after step 2")
zero.comm.barrier()
