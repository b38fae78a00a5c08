#!/usr/bin/env python3
"""transformers' LlamaForCausalLM trained by DeepSpeed (or PyTorch DDP) on
the batches zero-llama train uses: the comparison of
tests/llama/same_curve.sh and bench/run_llama.sh.

  zero-run --nproc N python bench/llama_peer.py --hf-dir DIR --config DS_CONFIG --tokens FILE \\
      --ctx T --steps S --out OUT.json [--ddp | --engine zero] [--save DIR] [--load DIR]

--engine zero: zero's Python package (python/zero, on PYTHONPATH) in place of
DeepSpeed, through the same calls (zero.initialize, engine.backward, ...):
the comparison of tests/python/same_curve.sh.

--ddp: torch.nn.parallel.DistributedDataParallel and torch.optim.AdamW with
the ds_config's micro-batch, lr, betas, eps and weight decay, instead of
deepspeed.initialize (no scheduler or clipping: a speed reference).

Step s's micro-batch k on data-parallel rank d holds the token file's
sequences (s*gas + k)*micro*dp + d*micro + i (i < micro), modulo their
number, as zero-llama train takes them. The loss is the mean float32
cross-entropy of the next-token predictions (T-1 per sequence).

With "sequence_parallel_size": P > 1 in the ds_config, DeepSpeed's Ulysses
(ALST) runs: UlyssesSPAttentionHF wraps transformers' sdpa attention (it
refuses eager), the P consecutive ranks of an sp group read one sequence
(T tokens in, the last label -100, as zero-llama train), each its T/P
tokens at their global positions, and the loss is ALST's: the sp group's
summed cross-entropy over its valid tokens, on every rank of the group;
dp rank = rank // P picks the sequences. OUT:
{"losses", "grad_norms", "lr", "step_s"}, one entry per step (losses averaged
over the ranks; step_s: rank 0's wall time of the step), and peak_rss_bytes
(the largest peak resident set of the ranks). One thread per rank, eager attention (transformers' reference).
If deepspeed cannot be imported, it says why in one line and exits 2.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import numpy as np
import torch


def next_token_loss(engine, batch):
    logits = engine(input_ids=batch[:, :-1]).logits.float()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))


class SumOverGroup(torch.autograd.Function):
    """ALST's differentiable all_gather of the ranks' losses, summed: forward
    the sum over the group, backward the sum of the ranks' gradients (what
    the all_gather's reduce-scatter gives back). torch's own
    torch.distributed.nn.functional.all_gather fails in backward on gloo for
    a group without global rank 0 (torch 2.15: its scatter takes group ranks
    for global ones)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        total = x.clone()
        torch.distributed.all_reduce(total, group=group)
        return total

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


def ulysses_loss(engine, batch, sp, sp_rank, mpu):
    """ALST's loss at sequence parallelism: this rank's T/P tokens in, the
    sp group's summed cross-entropy over the sequence's valid tokens out."""
    chunk = batch.size(1) // sp
    labels = torch.cat([batch[:, 1:], torch.full((batch.size(0), 1), -100, dtype=batch.dtype)], 1)
    own = slice(sp_rank * chunk, (sp_rank + 1) * chunk)
    positions = torch.arange(own.start, own.stop).unsqueeze(0).expand(batch.size(0), -1)
    logits = engine(input_ids=batch[:, own], position_ids=positions).logits.float()
    summed = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels[:, own].reshape(-1),
                                               ignore_index=-100, reduction="sum")
    return SumOverGroup.apply(summed, mpu.get_sequence_parallel_group()) / (labels != -100).sum()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--ctx", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--ddp", action="store_true")
    p.add_argument("--engine", choices=["deepspeed", "zero"], default="deepspeed")
    p.add_argument("--save", default="", help="engine.save_checkpoint into this folder after the steps")
    p.add_argument("--load", default="", help="engine.load_checkpoint from this folder first; the steps go on "
                   "from its step count to --steps, as zero-llama train --load does")
    args = p.parse_args()
    try:
        if args.engine == "zero":
            import zero as deepspeed  # the same calls, zero's engine
        else:
            import deepspeed
        from transformers import AutoModelForCausalLM
    except Exception as e:
        print(f"llama_peer.py: cannot import {args.engine} or transformers ({type(e).__name__}: {e})", file=sys.stderr)
        sys.exit(2)
    torch.set_num_threads(1)
    if args.engine == "zero":
        dist = deepspeed.comm
        dist.init_distributed()
    else:
        import deepspeed.ops
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # as bench/deepspeed_peer.py
        deepspeed.init_distributed(dist_backend="gloo")
        dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    config = json.load(open(args.config))
    micro, gas = config["train_micro_batch_size_per_gpu"], config.get("gradient_accumulation_steps", 1)
    sp = config.get("sequence_parallel_size", 1)
    if sp > 1 and args.ddp:
        sys.exit("llama_peer.py: --ddp with sequence_parallel_size > 1: DDP has no sequence parallelism; leave one out")
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, attn_implementation="sdpa" if sp > 1 else "eager")
    mpu = None
    if sp > 1:
        from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
        mpu = UlyssesSPAttentionHF.register_with_transformers(
            model_name_or_path=model, core_attn_implementation="sdpa", sequence_parallel_size=sp,
            micro_batch_size=micro, seq_length=args.ctx, seq_length_is_variable=False)
    if args.ddp:
        params = config["optimizer"].get("params", {})
        optimizer = torch.optim.AdamW(model.parameters(), lr=params.get("lr", 1e-3), betas=tuple(params.get("betas", (0.9, 0.999))),
                                      eps=params.get("eps", 1e-8), weight_decay=params.get("weight_decay", 0.01))
        ddp = torch.nn.parallel.DistributedDataParallel(model)

        class Engine:  # the calls below, on DDP and torch.optim
            def __call__(self, **kw):
                return ddp(**kw)

            def backward(self, loss):
                (loss / gas).backward()

            def step(self):
                self.micro = getattr(self, "micro", 0) + 1
                if self.micro % gas == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)

            def get_global_grad_norm(self):
                return None

            def get_lr(self):
                return [optimizer.param_groups[0]["lr"]]
        engine = Engine()
    else:
        extra = {"mpu": mpu} if mpu is not None else {}
        engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config, **extra)
    tokens = torch.from_numpy(np.fromfile(args.tokens, dtype="<u2").astype(np.int64))
    sequences = len(tokens) // args.ctx
    first = 0
    if args.load:
        engine.load_checkpoint(args.load)
        first = engine.global_steps
    losses, norms, lrs, times = [], [], [], []
    import time
    for step in range(first, args.steps):
        started = time.perf_counter()
        total = 0.0
        for k in range(gas):
            dp, d = world // sp, rank // sp
            rows = [((step * gas + k) * micro * dp + d * micro + i) % sequences for i in range(micro)]
            batch = torch.stack([tokens[s * args.ctx:(s + 1) * args.ctx] for s in rows])
            loss = ulysses_loss(engine, batch, sp, rank % sp, mpu) if sp > 1 else next_token_loss(engine, batch)
            engine.backward(loss)
            engine.step()
            total += loss.item()
        times.append(time.perf_counter() - started)
        mean = torch.tensor([total / gas], dtype=torch.float64)
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        norm = engine.get_global_grad_norm()
        norms.append(float(norm) if norm is not None else float("nan"))
        lrs.append(engine.get_lr()[0])
    if args.save:
        engine.save_checkpoint(args.save)
    import resource
    peak = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0], dtype=torch.float64)
    dist.all_reduce(peak, op="max" if args.engine == "zero" else torch.distributed.ReduceOp.MAX)
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "grad_norms": norms, "lr": lrs, "step_s": times, "deepspeed": deepspeed.__version__,
                       "transformers": __import__("transformers").__version__, "world": world,
                       "peak_rss_bytes": peak.item()}, f)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # as bench/deepspeed_peer.py: no interpreter teardown after the results are out


if __name__ == "__main__":
    main()
