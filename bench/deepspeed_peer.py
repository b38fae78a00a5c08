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
ranks). If deepspeed cannot be imported, it says why in one line and exits 2.
"""
import argparse
import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before deepspeed is imported

import torch

from torch_gpt import GPT, LossModel  # bench/torch_gpt.py


def zero_name(torch_name):
    """bench/torch_gpt.py's names as examples/gpt registers them (blocks.N.mlp.fc, blocks.N.mlp.proj)."""
    parts = torch_name.split(".")
    if len(parts) >= 3 and parts[0] == "blocks" and parts[2] in ("fc", "out"):
        parts[2:3] = ["mlp", "fc" if parts[2] == "fc" else "proj"]
    return ".".join(parts)


def batch(step, micro_index, rank, micro, context, vocab):
    i = torch.arange(micro).unsqueeze(1)
    j = torch.arange(context + 1).unsqueeze(0)
    tokens = (7 * i + 5 * step + 3 * (rank * micro) + 11 * micro_index + j) % vocab
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
                          ("steps", 20), ("threads", 1)]:
        parser.add_argument("--" + name, type=int, default=default)
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
    with open(args.config) as f:
        config = json.load(f)
    micro = config["train_micro_batch_size_per_gpu"]
    accumulation = config.get("gradient_accumulation_steps", 1)

    torch.manual_seed(0)
    gpt = GPT(args.vocab, args.context, args.depth, args.width, args.heads)
    if args.weights:
        load_weights(gpt, args.weights)
    model = LossModel(gpt)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    # At stage 0 DeepSpeed clips without recording the norm
    # (get_global_grad_norm() is None): the peer takes it from the averaged
    # gradients, before the step clips them, as DeepSpeed's clipping does.
    stage = config.get("zero_optimization", {}).get("stage", 0)
    losses, norms, lrs = [], [], []
    for step in range(args.steps):
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
    if rank == 0:
        with open(args.out, "w") as out:
            json.dump({"losses": losses, "grad_norms": norms, "lr": lrs, "deepspeed": deepspeed.__version__,
                       "torch": torch.__version__, "threads": args.threads, "world": world}, out)
    torch.distributed.barrier()
    # Done: leave without the interpreter's teardown, where a rank aborts
    # now and then with torch 2.15 and gloo ("terminate called without an
    # active exception"; plain DDP in bench/ddp_peer.py too), after the
    # results are out.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
