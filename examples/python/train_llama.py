#!/usr/bin/env python3
"""transformers' LlamaForCausalLM trained by zero from Python: the loop a
DeepSpeed user writes, with `import zero` for `import deepspeed`.

  zero-run --nproc 2 python examples/python/train_llama.py --config configs/zero3.json [--hf-dir DIR]
      [--steps 10] [--save DIR]

(or torchrun --nproc_per_node 2 ...). Without --hf-dir the model is a small
random Llama (seed 0). The batches are random tokens, the same on every
run; each data-parallel rank takes its rows.
"""
import argparse

import torch
import transformers

import zero


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a ds_config file")
    p.add_argument("--hf-dir", default="", help="a Hugging Face model folder (default: a small random Llama)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--ctx", type=int, default=32)
    p.add_argument("--save", default="", help="save a checkpoint here at the end (zero-llama train --load reads it)")
    args = p.parse_args()
    torch.set_num_threads(1)

    if args.hf_dir:
        model = transformers.AutoModelForCausalLM.from_pretrained(args.hf_dir, attn_implementation="eager")
    else:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, attn_implementation="eager"))

    # Stage 3 gathers each LlamaDecoderLayer (transformers' _no_split_modules) around its forward.
    engine, _, _, _ = zero.initialize(model=model, model_parameters=model.parameters(), config=args.config)
    dp = engine.dp_group
    micro = engine.train_micro_batch_size_per_gpu()
    data = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        for _ in range(engine.gradient_accumulation_steps()):
            tokens = torch.randint(0, model.config.vocab_size, (micro * dp.size, args.ctx), generator=data)
            mine = tokens[dp.rank * micro:(dp.rank + 1) * micro]
            loss = engine(input_ids=mine, labels=mine).loss
            engine.backward(loss)
            engine.step()
        mean = loss.detach().double().clone()
        zero.comm.all_reduce(mean, op="avg")
        if zero.comm.get_rank() == 0:
            print(f"step {step + 1} loss {mean.item():.6f} lr {engine.get_lr()[0]:.3e} "
                  f"grad_norm {engine.get_global_grad_norm():.4f}", flush=True)
    if args.save:
        engine.save_checkpoint(args.save)


if __name__ == "__main__":
    main()
