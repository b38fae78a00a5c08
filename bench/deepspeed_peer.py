#!/usr/bin/env python3
"""DeepSpeed beside zero: the GPT of examples/gpt (bench/torch_gpt.py, with
zero's parameter names) trained by deepspeed.initialize from the same
ds_config file zero reads, on CPU ranks (DS_ACCELERATOR=cpu, gloo).

  zero-run --nproc 2 python3 bench/deepspeed_peer.py --config CONFIG.json \\
      --weights INIT.safetensors --steps 20 --out losses.json [shape flags]

Both sides start from the same weights (--weights: a safetensors file by
zero's parameter names, e.g. what zero's engine wrote before its first
step) and see the same batches: rank r's micro-batch k of step s is
tokens[i, j] = (7 i + 5 s + 3 (r * micro) + 11 k + j) % vocab, arithmetic
that no random generator touches. The launcher's RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT (torchrun's variables) join the ranks.

Rank 0 writes --out: {"losses": [...], "grad_norms": [...], "lr": [...],
"deepspeed": version, "torch": version, "threads": n, "blas": kernels}, one
entry per optimizer step (the mean loss of its micro-batches over the
ranks). With --bench FILE (bench/run_vs_deepspeed.sh) it also times the steps after
--warmup ones and appends one JSON line to FILE, as bench_step_time does for
zero: the slowest rank's time per step and their median, rank 0's split of
a step (forward, backward, step: on CPU ranks each call has finished when it
returns), the peak and baseline resident set (largest over the ranks), the
bytes a rank sends per step, and with --checkpoint DIR the time to save and
load the trained state. Bytes are counted on one more step after the timed
ones, by wrapping deepspeed.comm's collectives: what a bandwidth-optimal
ring sends for each call, as zero's CommStats counts its own (all-reduce
2(N-1)/N of the tensor, reduce-scatter and all-gather (N-1)/N of the whole,
broadcast the tensor from its root; a reduce (N-1)/N of the tensor, since
DeepSpeed sends one per owner's slice of a bucket, together a reduce-scatter).

--save DIR writes DeepSpeed's checkpoint after the steps (engine.save_checkpoint);
--load DIR resumes one before them, the batches going on from its global
step (tools/fixtures/make_deepspeed_fixtures.py uses both).

If deepspeed cannot be imported, it says why in one line and exits 2.
"""
import argparse
import json
import os
import resource
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

import torch

from ddp_peer import blas_kernels  # what torch computes matrix products with, as the other rows record it
from torch_gpt import GPT, LossModel  # bench/torch_gpt.py


def zero_name(torch_name):
    """bench/torch_gpt.py's names as examples/gpt registers them (blocks.N.mlp.fc, blocks.N.mlp.proj)."""
    parts = torch_name.split(".")
    if len(parts) >= 3 and parts[0] == "blocks" and parts[2] in ("fc", "out"):
        parts[2:3] = ["mlp", "fc" if parts[2] == "fc" else "proj"]
    return ".".join(parts)


def batch(step, micro_index, rank, micro, context, vocab):
    """Row i of rank `rank`'s micro-batch is sample rank * micro + i of the step:
    the step's samples are the same whatever the world size that splits them
    (a checkpoint resumed at another world size sees the same data)."""
    sample = (rank * micro + torch.arange(micro)).unsqueeze(1)
    j = torch.arange(context + 1).unsqueeze(0)
    tokens = (7 * sample + 5 * step + 11 * micro_index + j) % vocab
    return tokens[:, :-1], tokens[:, 1:]


def load_weights(gpt, path):
    from safetensors.torch import load_file
    stored = load_file(path)
    with torch.no_grad():
        for name, p in gpt.named_parameters():
            key = zero_name(name)
            if key not in stored:
                raise SystemExit(f"deepspeed_peer.py: {path} has no tensor {key} (the model's {name})")
            if tuple(stored[key].shape) != tuple(p.shape):
                raise SystemExit(f"deepspeed_peer.py: {key} is {list(stored[key].shape)} in {path}, "
                                 f"{list(p.shape)} in the model")
            p.copy_(stored[key].to(p.dtype))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True)
    parser.add_argument("--weights", default="")
    parser.add_argument("--out", required=True)
    for name, default in [("vocab", 29), ("depth", 2), ("width", 32), ("heads", 2), ("context", 16),
                          ("steps", 20), ("threads", 1), ("warmup", 0), ("expect-params", 0)]:
        parser.add_argument("--" + name, type=int, default=default)
    parser.add_argument("--bench", default="", help="append the timing line to this JSON-lines file")
    parser.add_argument("--label", default="")
    parser.add_argument("--checkpoint", default="", help="with --bench: time save_checkpoint and load_checkpoint here")
    parser.add_argument("--profile", default="", help="with --bench: rank 0's profile of the timed steps (cProfile) to this file")
    parser.add_argument("--save", default="", help="after the steps, engine.save_checkpoint into this folder")
    parser.add_argument("--load", default="", help="before the steps, engine.load_checkpoint from this folder; "
                        "the steps' batches go on from its global step")
    args = parser.parse_args()
    try:
        import deepspeed
    except Exception as e:  # not installed, or it cannot build its ops here
        print(f"deepspeed_peer.py: cannot import deepspeed ({type(e).__name__}: {e})", file=sys.stderr)
        sys.exit(2)

    torch.set_num_threads(args.threads)
    # DeepSpeed's shared-memory all-reduce op serves inference_all_reduce,
    # not training, and compiling it takes minutes on a fresh machine: left
    # out, training takes gloo's collectives all the same.
    import deepspeed.ops
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    rss_baseline = current_rss()  # torch, deepspeed and gloo, before the model
    with open(args.config) as f:
        config = json.load(f)
    micro = config["train_micro_batch_size_per_gpu"]
    accumulation = config.get("gradient_accumulation_steps", 1)

    torch.manual_seed(0)
    gpt = GPT(args.vocab, args.context, args.depth, args.width, args.heads)
    if args.weights:
        load_weights(gpt, args.weights)
    model = LossModel(gpt)
    params = sum(p.numel() for p in model.parameters())
    if args.expect_params and params != args.expect_params:
        raise SystemExit(f"deepspeed_peer.py: the Python GPT has {params} parameters, zero's {args.expect_params}; "
                         "the two models must match (same --vocab, --depth, --width, --context)")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if args.bench:
        bench(args, engine, config, rank, world, params, rss_baseline)
        leave()

    # At stage 0 DeepSpeed clips without recording the norm
    # (get_global_grad_norm() is None): the peer takes it from the averaged
    # gradients, before the step clips them, as DeepSpeed's clipping does.
    stage = config.get("zero_optimization", {}).get("stage", 0)
    first = 0
    if args.load:
        path, _ = engine.load_checkpoint(args.load)
        if path is None:
            raise SystemExit(f"deepspeed_peer.py: DeepSpeed found no checkpoint in {args.load}")
        first = engine.global_steps
    losses, norms, lrs = [], [], []
    for step in range(first, first + args.steps):
        total, own_norm = 0.0, None
        for k in range(accumulation):
            tokens, targets = batch(step, k, rank, micro, args.context, args.vocab)
            loss = engine(tokens, targets)
            engine.backward(loss)
            if stage == 0 and k == accumulation - 1:
                grads = [p.grad.double() for p in model.parameters() if p.grad is not None]
                own_norm = torch.sqrt(sum((g * g).sum() for g in grads)).item()
            engine.step()
            total += loss.item()
        mean = torch.tensor([total / accumulation], dtype=torch.float64)
        torch.distributed.all_reduce(mean)
        losses.append(mean.item() / world)
        norm = engine.get_global_grad_norm()
        norms.append(float(norm) if norm is not None else own_norm)
        lrs.append(engine.get_lr()[0])
    if args.save:
        engine.save_checkpoint(args.save)
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump({"losses": losses, "grad_norms": norms, "lr": lrs, "deepspeed": deepspeed.__version__,
                       "torch": torch.__version__, "threads": args.threads, "world": world}, out)
    leave()


def leave():
    """Done: leave without the interpreter's teardown, where a rank aborts now
    and then with torch 2.15 and gloo ("terminate called without an active
    exception"; plain DDP in bench/ddp_peer.py too), after the results are out."""
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def current_rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class SentBytes:
    """Counts what this rank sends through deepspeed.comm, per call as a
    bandwidth-optimal ring sends it (the rule zero's CommStats follows)."""

    def __init__(self, world):
        import deepspeed.comm as dscomm
        self.world, self.total, self.by_op, self.on = world, 0.0, {}, False
        share = (world - 1) / world
        nbytes = lambda t: t.numel() * t.element_size()
        rules = {
            "all_reduce": lambda a, k: 2 * share * nbytes(a[0] if a else k["tensor"]),
            "all_reduce_coalesced": lambda a, k: 2 * share * sum(nbytes(t) for t in (a[0] if a else k["tensors"])),
            # DeepSpeed reduces a bucket with one reduce per owner's slice: together a reduce-scatter.
            "reduce": lambda a, k: share * nbytes(a[0] if a else k["tensor"]),
            "reduce_scatter_tensor": lambda a, k: share * nbytes(a[1] if len(a) > 1 else k["tensor"]),
            "reduce_scatter": lambda a, k: share * sum(nbytes(t) for t in (a[1] if len(a) > 1 else k["input_list"])),
            "all_gather_into_tensor": lambda a, k: share * nbytes(a[0] if a else k["output_tensor"]),
            "all_gather": lambda a, k: (world - 1) * nbytes(a[1] if len(a) > 1 else k["tensor"]),
            "all_gather_coalesced": lambda a, k: (world - 1) * sum(nbytes(t) for t in (a[1] if len(a) > 1 else k["input_tensors"])),
            "broadcast": lambda a, k: nbytes(a[0] if a else k["tensor"]) if (a[1] if len(a) > 1 else k["src"]) == torch.distributed.get_rank() else 0,
        }
        # Wrapped where DeepSpeed's callers find them (deepspeed.comm) and where
        # its helpers do (allgather_fn, reduce_scatter_fn: deepspeed.comm.comm's globals).
        for name, rule in rules.items():
            wrapped = self._wrap(name, getattr(dscomm.comm, name), rule)
            setattr(dscomm, name, wrapped)
            setattr(dscomm.comm, name, wrapped)

    def _wrap(self, name, original, rule):
        def counted(*a, **k):
            if self.on:
                sent = rule(a, k)
                self.total += sent
                self.by_op[name] = self.by_op.get(name, 0.0) + sent
            return original(*a, **k)
        return counted


def bench(args, engine, config, rank, world, params, rss_baseline):
    """The timing mode: --warmup then --steps timed steps, one more counted for bytes."""
    import statistics
    import time
    micro = config["train_micro_batch_size_per_gpu"]
    sent = SentBytes(world)
    times, forward, backward, step_s = [], [], [], []
    profiler = None
    if args.profile and rank == 0:
        import cProfile
        profiler = cProfile.Profile()
    for step in range(args.warmup + args.steps + 1):
        if profiler and step == args.warmup:
            profiler.enable()
        if profiler and step == args.warmup + args.steps:
            profiler.disable()
        sent.on = step == args.warmup + args.steps  # the last step, after the timed ones
        tokens, targets = batch(step, 0, rank, micro, args.context, args.vocab)
        start = time.perf_counter()
        loss = engine(tokens, targets)
        forward_done = time.perf_counter()
        engine.backward(loss)
        backward_done = time.perf_counter()
        engine.step()
        done = time.perf_counter()
        if args.warmup <= step < args.warmup + args.steps:
            times.append(done - start)
            forward.append(forward_done - start)
            backward.append(backward_done - forward_done)
            step_s.append(done - backward_done)
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # before the checkpoint's buffers
    if profiler:
        import pstats
        with open(args.profile, "w") as out:
            out.write(f"DeepSpeed {args.label}, rank 0 of {world}, {args.steps} steps: the functions by own time\n")
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    save_s = load_s = sync_s = float("nan")
    if args.checkpoint:
        torch.distributed.barrier()
        start = time.perf_counter()
        engine.save_checkpoint(args.checkpoint, tag="bench")
        save_s = time.perf_counter() - start
        # torch.save leaves the files in the page cache; zero's save returns
        # once its files are on disk (fsync). The sync after it makes the
        # two alike: durable when the call returns.
        os.sync()
        sync_s = time.perf_counter() - start
        torch.distributed.barrier()
        start = time.perf_counter()
        engine.load_checkpoint(args.checkpoint, tag="bench")
        load_s = time.perf_counter() - start
    gathered = torch.tensor(times + [sent.total, peak_rss, rss_baseline, save_s, load_s, sync_s], dtype=torch.float64)
    torch.distributed.all_reduce(gathered, op=torch.distributed.ReduceOp.MAX)
    slowest = gathered[:len(times)].tolist()
    sent_total, peak_rss, rss_baseline, save_s, load_s, sync_s = gathered[len(times):].tolist()
    if rank == 0:
        zero_config = config.get("zero_optimization", {})
        line = {"bench": "vs_deepspeed", "side": "deepspeed", "label": args.label, "world": world,
                "threads": args.threads, "params": params, "stage": zero_config.get("stage", 0),
                "offload_optimizer": zero_config.get("offload_optimizer", {}).get("device", "none"),
                "warmup": args.warmup, "steps": args.steps, "step_s": statistics.median(slowest), "step_times": slowest,
                "split_s": {"forward": statistics.median(forward), "backward": statistics.median(backward),
                            "step": statistics.median(step_s)},
                "bytes_per_step": sent_total, "bytes_by_op": sent.by_op, "peak_rss": peak_rss,
                "rss_baseline": rss_baseline, "deepspeed": deepspeed_version(), "torch": torch.__version__,
                "blas": blas_kernels()[0]}
        if args.checkpoint:
            line.update(save_s=save_s, load_s=load_s, save_durable_s=sync_s)
        with open(args.bench, "a") as out:
            out.write(json.dumps(line) + "\n")
        print(f"DeepSpeed {args.label}, {world} ranks x {args.threads} thread(s): median step {line['step_s'] * 1e3:.1f} ms, "
              f"{sent_total / 1e6:.2f} MB sent per step per rank, peak RSS {peak_rss / 1e6:.0f} MB"
              + (f", checkpoint saved in {save_s:.2f} s ({sync_s:.2f} s with the sync), loaded in {load_s:.2f} s"
                 if args.checkpoint else ""))


def deepspeed_version():
    import deepspeed
    return deepspeed.__version__


if __name__ == "__main__":
    main()
