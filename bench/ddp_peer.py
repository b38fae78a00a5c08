#!/usr/bin/env python3
"""The peer zero is compared with: PyTorch DistributedDataParallel over gloo.

The same GPT as examples/gpt (pre-LayerNorm blocks, fused qkv, causal
softmax in float32, GELU MLP, tied embedding/head, GPT-2 initialisation),
the same per-rank micro batch and context, AdamW(lr 3e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.01) and clipping at 1.0, as bench_step_time trains
with. Tokens are random ids of the same vocabulary (the step's arithmetic
does not depend on their values).

  zero-run --nproc N python3 bench/ddp_peer.py --mode ddp   --out st.jsonl [...]
  python3 bench/ddp_peer.py                    --mode plain --out st.jsonl [...]

Each step's time is the slowest rank's; the figure is the median over the
measured steps after the warm-up. Minor page faults per step (getrusage,
over the measured steps) and the peak resident set size (the Python process
included) are the largest over the ranks. One JSON line is appended to
--out, read by `bench_step_time --mode report`.
"""
import argparse
import ctypes
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from torch_gpt import GPT  # bench/torch_gpt.py, the model FSDP2's reference trains too


class LossModel(nn.Module):
    """The GPT and its mean cross-entropy (in float32) in one forward, as DDP wraps it."""

    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, tokens, targets):
        logits = self.gpt(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def allocator():
    preload = os.environ.get("LD_PRELOAD", "")
    for name in ("tcmalloc", "jemalloc", "mimalloc"):
        if name in preload:
            return name
    return "glibc malloc"


def openblas_kernels():
    """The kernels OpenBLAS picked in this process, as bench_step_time records them."""
    try:
        name = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except (OSError, AttributeError):
        return ""
    name.restype = ctypes.c_char_p
    return name().decode()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["ddp", "plain"], default="ddp")
    parser.add_argument("--out", default="step_time.jsonl")
    for name, default in [("vocab", 29), ("depth", 6), ("width", 768), ("heads", 12), ("context", 64),
                          ("micro", 2), ("warmup", 2), ("steps", 10), ("threads", 0), ("expect-params", 0)]:
        parser.add_argument("--" + name, type=int, default=default)
    args = parser.parse_args()

    ddp = args.mode == "ddp"
    if ddp:
        # The launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as torchrun sets it.
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)

    torch.manual_seed(0)
    model = LossModel(GPT(args.vocab, args.context, args.depth, args.width, args.heads))
    params = sum(p.numel() for p in model.parameters())
    if args.expect_params and params != args.expect_params:
        raise SystemExit(f"ddp_peer.py: the Python GPT has {params} parameters, the C++ one {args.expect_params}; "
                         "the two models must match (same --vocab, --depth, --width, --context)")
    trained = nn.parallel.DistributedDataParallel(model) if ddp else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1 + rank)

    times, faults_before = [], 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        tokens = torch.randint(0, args.vocab, (args.micro, args.context + 1), generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad()
        trained(tokens[:, :-1], tokens[:, 1:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    faults = (usage.ru_minflt - faults_before) / args.steps
    peak_rss = usage.ru_maxrss * 1024
    if ddp:
        gathered = torch.tensor(times + [faults, peak_rss], dtype=torch.float64)
        dist.all_reduce(gathered, op=dist.ReduceOp.MAX)
        times, faults, peak_rss = gathered[:-2].tolist(), gathered[-2].item(), gathered[-1].item()
    if rank == 0:
        line = {"bench": "step_time", "mode": "ddp" if ddp else "python", "world": world, "threads": threads,
                "params": params, "depth": args.depth, "width": args.width, "context": args.context,
                "micro": args.micro, "warmup": args.warmup, "steps": args.steps,
                "step_s": statistics.median(times), "step_times": times,
                "minflt_per_step": faults, "peak_rss": peak_rss, "torch": torch.__version__,
                "allocator": allocator(), "blas": openblas_kernels()}
        with open(args.out, "a") as out:
            out.write(json.dumps(line) + "\n")
        label = f"PyTorch DDP over gloo, {world} ranks" if ddp else "plain PyTorch, 1 process"
        label += f", {allocator()}"
        print(f"{label} x {threads} thread(s): median step {line['step_s'] * 1e3:.1f} ms, "
              f"{faults:.0f} minor faults per step, peak RSS {peak_rss / 1e6:.0f} MB")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
