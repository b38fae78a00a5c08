#!/usr/bin/env python3
"""The peers zero is compared with: PyTorch DistributedDataParallel over gloo,
and PyTorch FSDP2 (fully_shard, torch >= 2.6) over gloo, each transformer
block sharded on its own and then the root (ZeRO-3's layout).

The same GPT as examples/gpt (pre-LayerNorm blocks, fused qkv, causal
softmax in float32, GELU MLP, tied embedding/head, GPT-2 initialisation),
the same per-rank micro batch and context, AdamW(lr 3e-4, betas 0.9/0.95,
eps 1e-8, weight decay 0.01) and clipping at 1.0, as bench_step_time trains
with. Tokens are random ids of the same vocabulary (the step's arithmetic
does not depend on their values).

  zero-run --nproc N python3 bench/ddp_peer.py --mode ddp   --out st.jsonl [...]
  zero-run --nproc N python3 bench/ddp_peer.py --mode fsdp2 --out st.jsonl [...]
  python3 bench/ddp_peer.py                    --mode plain --out st.jsonl [...]
  python3 bench/ddp_peer.py --mode fsdp2 --check   (exit 1 and one line on stderr: this torch cannot)

Each step's time is the slowest rank's; the figure is the median over the
measured steps after the warm-up. Minor page faults per step (getrusage,
over the measured steps) and the peak resident set size (the Python process
included) are the largest over the ranks. One JSON line is appended to
--out, read by `bench_step_time --mode report`; its "losses" are rank 0's
per step (warm-up included): with the same seeds, ddp and fsdp2 match.
"""
import argparse
import ctypes
import json
import os
import re
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

from torch_gpt import GPT, LossModel  # bench/torch_gpt.py, the model FSDP2's reference trains too


def allocator():
    preload = os.environ.get("LD_PRELOAD", "")
    for name in ("tcmalloc", "jemalloc", "mimalloc"):
        if name in preload:
            return name
    return "glibc malloc"


def blas_kernels():
    """What torch computes matrix products with: "mkl" when it links MKL (the
    PyPI wheel, inside libtorch_cpu; MKL picks its code path itself), else the
    kernels OpenBLAS picked in this process (Debian's torch), as bench_step_time
    records them. Returns (kernels, the library's line in torch's build config)."""
    config = torch.__config__.show()
    if re.search(r"BLAS_INFO=mkl\b", config) and torch.backends.mkl.is_available():
        library = re.search(r"^\s*- (.*Math Kernel Library.*)$", config, re.MULTILINE)
        return "mkl", library.group(1) if library else "MKL"
    # Asked only when torch does not use MKL: in a wheel's process libopenblas would name kernels torch never runs.
    try:
        name = ctypes.CDLL("libopenblas.so.0").openblas_get_corename
    except (OSError, AttributeError):
        return "", ""
    name.restype = ctypes.c_char_p
    return name().decode(), "OpenBLAS"


def fully_shard_or_why():
    """FSDP2's fully_shard, or None and why this torch has none."""
    # Asked by version first: Debian's 1.13 fails even to import its FSDP1 package under Python 3.11.
    if torch.__version__ < "2.6":
        return None, f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2 needs torch >= 2.6)"
    try:
        from torch.distributed.fsdp import fully_shard
        return fully_shard, ""
    except Exception as e:  # a build without it
        return None, f"torch {torch.__version__} cannot import torch.distributed.fsdp.fully_shard ({type(e).__name__}: {e})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=["ddp", "fsdp2", "plain"], default="ddp")
    parser.add_argument("--out", default="step_time.jsonl")
    parser.add_argument("--check", action="store_true", help="only say whether this torch can run --mode")
    for name, default in [("vocab", 29), ("depth", 6), ("width", 768), ("heads", 12), ("context", 64),
                          ("micro", 2), ("warmup", 2), ("steps", 10), ("threads", 0), ("expect-params", 0)]:
        parser.add_argument("--" + name, type=int, default=default)
    args = parser.parse_args()

    if args.mode == "fsdp2":
        fully_shard, why = fully_shard_or_why()
        if fully_shard is None:
            if os.environ.get("RANK", "0") == "0":  # one line, not one per rank
                print(f"note: {sys.executable}: {why}: the FSDP2 row is left out", file=sys.stderr)
            sys.exit(1)
    if args.check:
        return

    distributed = args.mode in ("ddp", "fsdp2")  # one process per rank
    if distributed:
        # The launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), as torchrun sets it.
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    threads = args.threads or max(1, (os.cpu_count() or 1) // world)
    torch.set_num_threads(threads)
    rss_baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # torch and gloo, before the model

    torch.manual_seed(0)
    model = LossModel(GPT(args.vocab, args.context, args.depth, args.width, args.heads))
    params = sum(p.numel() for p in model.parameters())
    if args.expect_params and params != args.expect_params:
        raise SystemExit(f"ddp_peer.py: the Python GPT has {params} parameters, the C++ one {args.expect_params}; "
                         "the two models must match (same --vocab, --depth, --width, --context)")
    if args.mode == "fsdp2":
        # Every rank built the same full model (same seed); fully_shard keeps
        # its shard. A unit per block, gathered for its forward and backward
        # only, then the root (embeddings, tied head, final LayerNorm).
        for block in model.gpt.blocks:
            fully_shard(block)
        fully_shard(model)
        trained = model
    else:
        trained = nn.parallel.DistributedDataParallel(model) if distributed else model
    # After fully_shard: the parameters are then the DTensor shards, and
    # clip_grad_norm_ takes the norm over all of them.
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    generator = torch.Generator().manual_seed(1 + rank)

    times, losses, faults_before = [], [], 0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            faults_before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        tokens = torch.randint(0, args.vocab, (args.micro, args.context + 1), generator=generator)
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = trained(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        losses.append(loss.item())  # on the CPU the step is done: outside the timing, it costs nothing
    usage = resource.getrusage(resource.RUSAGE_SELF)
    faults = (usage.ru_minflt - faults_before) / args.steps
    peak_rss = usage.ru_maxrss * 1024
    if distributed:
        gathered = torch.tensor(times + [faults, peak_rss, rss_baseline], dtype=torch.float64)
        dist.all_reduce(gathered, op=dist.ReduceOp.MAX)
        times, (faults, peak_rss, rss_baseline) = gathered[:-3].tolist(), gathered[-3:].tolist()
    if rank == 0:
        blas, blas_library = blas_kernels()
        line = {"bench": "step_time", "mode": args.mode if distributed else "python", "world": world, "threads": threads,
                "params": params, "depth": args.depth, "width": args.width, "context": args.context,
                "micro": args.micro, "warmup": args.warmup, "steps": args.steps,
                "step_s": statistics.median(times), "step_times": times,
                "minflt_per_step": faults, "peak_rss": peak_rss, "rss_baseline": rss_baseline,
                "torch": torch.__version__, "allocator": allocator(), "blas": blas, "blas_library": blas_library,
                "losses": losses}
        with open(args.out, "a") as out:
            out.write(json.dumps(line) + "\n")
        label = {"ddp": f"PyTorch DDP over gloo, {world} ranks", "fsdp2": f"PyTorch FSDP2 over gloo, {world} ranks",
                 "plain": "plain PyTorch, 1 process"}[args.mode]
        label += f", torch {torch.__version__}, BLAS {blas or 'unknown'}, {allocator()}"
        print(f"{label} x {threads} thread(s): median step {line['step_s'] * 1e3:.1f} ms, "
              f"{faults:.0f} minor faults per step, peak RSS {peak_rss / 1e6:.0f} MB")
    if distributed:
        dist.barrier()
        # Leave without the interpreter's teardown: with torch 2.15 and gloo
        # a rank aborts there about one run in three ("terminate called
        # without an active exception"), after the results are out.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
