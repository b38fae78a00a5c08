#!/usr/bin/env python3
"""Helpers of bench/run_llama.sh (zero-llama train against transformers +
DeepSpeed and transformers + PyTorch DDP on one ~125 M-parameter Llama):

  llama_bench.py make DIR        a random LlamaForCausalLM (hidden 768, 12
                                 layers, 12 heads, 4 key/value heads, MLP
                                 2048, vocab 32000; 125 M parameters) saved
                                 with save_pretrained in DIR, and DIR/tokens.bin
  llama_bench.py config DIR STAGE  DIR/stage<STAGE>.json, the ds_config of a row
  llama_bench.py table JSONL OUT.md  the table of the rows
  llama_bench.py peak            one thread's fp32 matrix-product rate (GFLOP/s):
                                 the best of 5 products of 1024 x 1024 matrices,
                                 with the same torch (and BLAS) the rows use
"""
import json
import os
import statistics
import sys
import time

import torch

CTX, MICRO = 256, 1


def make(folder):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                         num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=1024,
                         tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(folder)
    g = torch.Generator().manual_seed(1)
    torch.randint(0, 32000, (64 * CTX,), generator=g, dtype=torch.int32).to(torch.int32).numpy().astype("<u2").tofile(
        os.path.join(folder, "tokens.bin"))


def config(folder, stage):
    c = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": 1, "gradient_clipping": 1.0,
         "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
         "zero_optimization": {"stage": int(stage)}}
    if int(stage) == 3:
        c["zero_optimization"]["stage3_param_persistence_threshold"] = 0
    path = os.path.join(folder, f"stage{stage}.json")
    with open(path, "w") as f:
        json.dump(c, f, indent=1)
    print(path)


def peak():
    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    print(f"{2 * 1024 ** 3 / best / 1e9:.2f}")


def table(lines, out):
    rows = [json.loads(l) for l in open(lines)]
    md = ["| system | stage | step (s, median) | tokens/s | MFU | step time vs transformers + DeepSpeed | vs transformers + DDP |",
          "|---|---|---|---|---|---|---|"]
    ds = {r["stage"]: r["step_s"] for r in rows if r["system"] == "transformers + DeepSpeed"}
    ddp = next((r["step_s"] for r in rows if r["system"] == "transformers + DDP"), None)
    for r in rows:
        zero = r["system"] == "zero"
        ratio = f"{r['step_s'] / ds[r['stage']]:.2f}x" if zero and r["stage"] in ds else ""
        vs_ddp = f"{r['step_s'] / ddp:.2f}x" if zero and ddp else ""
        md.append(f"| {r['system']} | {r['stage']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% | {ratio} | {vs_ddp} |")
    r = rows[0]
    md.append("")
    md.append(f"{r['params'] / 1e6:.1f} M parameters, {r['ranks']} ranks x 1 thread, micro-batch {MICRO} x {CTX} tokens, "
              f"fp32, AdamW; kernels: {r['kernels']}; MFU: {r['flops_per_token'] / 1e6:.0f} MFLOP per token (6 x the "
              f"non-embedding parameters + attention) x tokens/s over {r['ranks']} x the measured one-thread "
              f"matrix-product rate ({r['peak_gflops']:.1f} GFLOP/s); medians of {r['timed']} steps after "
              f"{r['warmup']} warm-up steps.")
    open(out, "w").write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    command = sys.argv[1]
    if command == "make":
        make(sys.argv[2])
    elif command == "config":
        config(sys.argv[2], sys.argv[3])
    elif command == "peak":
        peak()
    elif command == "table":
        table(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
