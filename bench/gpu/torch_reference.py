"""The PyTorch references of the GPU table (bench/gpu/run_all.sh): the GPT
of examples/gpt (bench/torch_gpt.py: pre-LN blocks, fused qkv, attention as
matmul + float32 softmax, GELU MLP x4, learned positions, head tied to the
token embedding) on the same batch as bench_offload_headline (random
tokens, micro x context), bf16 compute, AdamW (lr 1e-4, betas 0.9/0.95,
weight decay 0.01), clipping 1.0. --mode:
  plain          a plain loop: fp32 weights, torch.autocast(bf16), AdamW
  fsdp2          fully_shard per block and on the whole, MixedPrecisionPolicy
                 (bf16 params, fp32 reduction)
  fsdp2-offload  the same with CPUOffloadPolicy(pin_memory=True)

    python3 bench/gpu/torch_reference.py --mode fsdp2-offload --depth 32 \\
        --width 4096 --heads 32 --context 1024 --micro 2 --cap-gb 80

Per step: wall time of forward + backward + clip + step (synchronised),
median over --steps after --warmup. Prints one JSON line ("result": ...)
like bench_offload_headline and appends it to --out when given. Running out
of memory is a result ("oom": true), not a crash. --device cpu runs the
same code on CPU ranks over gloo (the rehearsal: bench/gpu/rehearse.sh).
Needs torch >= 2.6 for fully_shard.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from torch_gpt import GPT  # noqa: E402  (bench/torch_gpt.py, shared with bench/ddp_peer.py)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["plain", "fsdp2", "fsdp2-offload"], default="fsdp2-offload")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--micro", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--cap-gb", type=float, default=0)
    ap.add_argument("--adam", choices=["foreach", "fused"], default="foreach")
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29533"), ("RANK", "0"), ("WORLD_SIZE", "1")):
        os.environ.setdefault(key, value)
    cuda = a.device == "cuda"
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo")
    rank = dist.get_rank()
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(device)
        total = torch.cuda.get_device_properties(device).total_memory
        if a.cap_gb > 0:
            torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_gb * 1e9 / total), device)
    else:
        device, total = torch.device("cpu"), -1
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // dist.get_world_size()))

    result = {"reference": a.mode, "torch": torch.__version__, "adam": a.adam, "device": str(device),
              "device_name": torch.cuda.get_device_name(device) if cuda else "",
              "ranks": dist.get_world_size(), "depth": a.depth, "width": a.width, "context": a.context,
              "micro_batch": a.micro, "tokens_per_step": a.micro * a.context * dist.get_world_size(),
              "cap_bytes": a.cap_gb * 1e9, "device_total_bytes": total, "oom": False}
    t0 = time.perf_counter()
    phase = "building the model"
    times = []
    try:
        torch.manual_seed(0)
        model = GPT(a.vocab, a.context, a.depth, a.width, a.heads)
        result["params"] = sum(p.numel() for p in model.parameters())
        if a.mode == "plain":
            model.to(device)
        else:
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            extra = {"offload_policy": CPUOffloadPolicy(pin_memory=cuda)} if a.mode == "fsdp2-offload" else {}
            if a.mode == "fsdp2" or not cuda:
                model.to(device)
            for block in model.blocks:
                fully_shard(block, mp_policy=mp, **extra)
            fully_shard(model, mp_policy=mp, **extra)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.01,
                                  foreach=a.adam == "foreach", fused=a.adam == "fused")
        result["init_s"] = time.perf_counter() - t0

        phase = "training"
        gen = torch.Generator().manual_seed(1234 + rank)
        for step in range(a.warmup + a.steps):
            tokens = torch.randint(0, a.vocab, (a.micro, a.context + 1), generator=gen).to(device)
            dist.barrier()
            t = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.mode == "plain"):
                logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            optim.zero_grad(set_to_none=True)
            if cuda:
                torch.cuda.synchronize(device)
            took = time.perf_counter() - t
            if step >= a.warmup:
                times.append(took)
            if rank == 0:
                print(f"step {step}: {took:.3f} s, loss {loss.item():.4f}", flush=True)
        result["step_s_median"] = statistics.median(times)
    except torch.OutOfMemoryError as e:
        result["oom"] = True
        result["oom_phase"] = phase
        result["oom_message"] = str(e).splitlines()[0]
    result["step_s"] = times
    result["device_peak_bytes"] = torch.cuda.max_memory_allocated(device) if cuda else -1
    result["host_peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if rank == 0:
        line = json.dumps({"result": result})
        print(line, flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(line + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
