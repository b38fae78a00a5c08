#!/usr/bin/env python3
"""The ds_config files and the table of bench/run_vs_deepspeed.sh.

  vs_deepspeed.py configs DIR [--nvme PATH]   writes DIR/<name>.json, one per row, and prints the names
  vs_deepspeed.py report LINES.jsonl          prints the tables (markdown) from the measured lines

Every row trains with one file that zero (bench_step_time --config) and
DeepSpeed (bench/deepspeed_peer.py --config) both read: AdamW (lr 3e-4,
betas 0.9/0.95, eps 1e-8, weight decay 0.01), clipping at 1.0, fp32, micro
batch 2, no accumulation, overlap_comm, a 5e6-element reduce bucket, and
DeepSpeed's defaults for every other key. The PyTorch rows (DDP, FSDP2, the
plain loops) train the same model with the same AdamW and clipping.
"""
import json
import math
import os
import statistics
import sys
from collections import defaultdict


def base_config(stage):
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
        "gradient_clipping": 1.0,
        "steps_per_print": 1000000000,
        "zero_optimization": {"stage": stage, "overlap_comm": True, "contiguous_gradients": True,
                              "reduce_bucket_size": 5000000},
    }


def configs(folder, nvme):
    """The rows: stages 0-3, offload_optimizer cpu at 2 and 3, NVMe at 3 when nvme is a folder."""
    rows = {f"stage{s}": base_config(s) for s in range(4)}
    for stage in (2, 3):
        c = base_config(stage)
        c["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
        rows[f"stage{stage}_offload_cpu"] = c
    if nvme:
        c = base_config(3)
        c["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme}
        c["aio"] = {"block_size": 1048576, "queue_depth": 8, "single_submit": False, "overlap_events": True}
        rows["stage3_offload_nvme"] = c
    os.makedirs(folder, exist_ok=True)
    for name, c in rows.items():
        with open(os.path.join(folder, name + ".json"), "w") as out:
            json.dump(c, out, indent=1)
        print(name)


def pooled(lines):
    """One row's lines over the rounds: step times pooled and their median;
    the largest peak RSS; the median of the rest."""
    j = dict(lines[-1])
    j["step_s"] = statistics.median(t for line in lines for t in line["step_times"])
    j["rounds"] = len(lines)
    j["peak_rss"] = max(line["peak_rss"] for line in lines)
    for key in ("save_s", "save_durable_s", "load_s", "bytes_per_step", "rss_baseline"):
        values = [line[key] for line in lines if key in line and not math.isnan(line[key])]
        if values:
            j[key] = statistics.median(values)
    return j


def fmt(value, scale=1.0, digits=1):
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value * scale:.{digits}f}"


def ratio(a, b):
    return a / b if a is not None and b else None


def goal(r, limit):
    return "-" if r is None else ("pass" if r <= limit else "miss")


def report(path):
    rows = defaultdict(list)  # (side, world, label) -> lines
    disk = defaultdict(list)
    kernels, versions = set(), {}
    with open(path) as f:
        for text in f:
            if not text.strip():
                continue
            j = json.loads(text)
            if j.get("bench") == "disk":
                disk[(j["side"], j["world"])].append(j["bytes"])
                continue
            kernels.add(j.get("blas") or "not recorded")
            for key in ("torch", "deepspeed"):
                if key in j:
                    versions[key] = j[key]
            side = j.get("side") or {"plain": "plain LibTorch", "python": "plain PyTorch"}.get(j["mode"], j["mode"])
            world = 1 if j.get("mode") in ("plain", "python") else j["world"]
            rows[(side, world, j.get("label", ""))].append(j)
    table = {k: pooled(v) for k, v in rows.items()}
    plain_cpp = table.get(("plain LibTorch", 1, ""))
    plain_py = table.get(("plain PyTorch", 1, ""))
    worlds = sorted({w for (_, w, _) in table if w > 1})
    labels = sorted({l for (s, _, l) in table if s == "zero"}, key=lambda l: (l[:6], len(l), l))
    any_line = next(iter(table.values()))
    print(f"GPT of {any_line['params'] / 1e6:.1f} M parameters (depth 6, width 768, context 64), micro batch 2, fp32, "
          f"AdamW, clipping 1.0; 1 thread per process; DeepSpeed {versions.get('deepspeed', '?')} (CPU accelerator, "
          f"gloo), torch {versions.get('torch', '?')}; BLAS kernels: {', '.join(sorted(kernels))}"
          f"{' in every row' if len(kernels) == 1 else ' (they differ: not like with like)'}.")
    print("Step time: the slowest rank's, median over the measured steps of every round pooled. Peak RSS: the "
          "largest rank's high-water mark (interpreter and libraries included); baseline: its resident set before "
          "the model was built. Bytes: per rank per step, what a bandwidth-optimal ring sends for each collective "
          "each side issued (zero's CommStats; deepspeed.comm's calls counted by the peer). Overhead: the step "
          "less the plain single-process loop of the same framework on the same per-rank batch (LibTorch for zero, "
          "PyTorch for the rest).")
    print(f"plain loops, 1 process x 1 thread: LibTorch {fmt(plain_cpp and plain_cpp['step_s'], 1e3)} ms, "
          f"PyTorch {fmt(plain_py and plain_py['step_s'], 1e3)} ms\n")
    base_cpp = plain_cpp["step_s"] if plain_cpp else None
    base_py = plain_py["step_s"] if plain_py else None
    for world in worlds:
        print(f"### {world} ranks x 1 thread ({os.cpu_count()} cores)\n")
        print("| ds_config | zero ms | DeepSpeed ms | zero / DS (goal <= 0.70) | zero peak RSS MB (baseline) | "
              "DeepSpeed peak RSS MB (baseline) | zero / DS (goal <= 0.70) | zero MB sent | DeepSpeed MB sent | "
              "zero overhead ms | DeepSpeed overhead ms |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for label in labels:
            z, d = table.get(("zero", world, label)), table.get(("deepspeed", world, label))
            if not z:
                continue
            zs, ds_ = z["step_s"], d["step_s"] if d else None
            rt, rm = ratio(zs, ds_), ratio(z["peak_rss"], d["peak_rss"] if d else None)
            print(f"| {label} | {fmt(zs, 1e3)} | {fmt(ds_, 1e3)} | {fmt(rt, 1, 3)} {goal(rt, 0.7)} | "
                  f"{fmt(z['peak_rss'], 1e-6, 0)} ({fmt(z.get('rss_baseline'), 1e-6, 0)}) | "
                  f"{fmt(d and d['peak_rss'], 1e-6, 0)} ({fmt(d and d.get('rss_baseline'), 1e-6, 0)}) | "
                  f"{fmt(rm, 1, 3)} {goal(rm, 0.7)} | {fmt(z.get('bytes_per_step'), 1e-6, 2)} | "
                  f"{fmt(d and d.get('bytes_per_step'), 1e-6, 2)} | "
                  f"{fmt(zs - base_cpp if base_cpp else None, 1e3)} | "
                  f"{fmt(ds_ - base_py if ds_ and base_py else None, 1e3)} |")
        for side, name in (("ddp", "PyTorch DDP"), ("fsdp2", "PyTorch FSDP2 (fully_shard per block)")):
            p = table.get((side, world, ""))
            if p:
                print(f"| {name} | - | {fmt(p['step_s'], 1e3)} (itself) | - | - | {fmt(p['peak_rss'], 1e-6, 0)} "
                      f"({fmt(p.get('rss_baseline'), 1e-6, 0)}) | - | - | - | - | "
                      f"{fmt(p['step_s'] - base_py if base_py else None, 1e3)} |")
        ckpt = [(label, table.get(("zero", world, label)), table.get(("deepspeed", world, label)))
                for label in labels if "save_s" in table.get(("zero", world, label), {})]
        for label, z, d in ckpt:
            zd, dd = disk.get(("zero", world)), disk.get(("deepspeed", world))
            rs = ratio(z["save_s"], d.get("save_durable_s") if d else None)
            print(f"\ncheckpoint at {label} (medians over the rounds): zero saves in {fmt(z['save_s'], 1, 2)} s, on "
                  f"disk when it returns (fsync), and loads in {fmt(z['load_s'], 1, 2)} s "
                  f"({fmt(zd and statistics.median(zd), 1e-6, 0)} MB); DeepSpeed saves in "
                  f"{fmt(d and d.get('save_s'), 1, 2)} s into the page cache, {fmt(d and d.get('save_durable_s'), 1, 2)} s "
                  f"with a sync after it, and loads in {fmt(d and d.get('load_s'), 1, 2)} s "
                  f"({fmt(dd and statistics.median(dd), 1e-6, 0)} MB); durable save zero / DS {fmt(rs, 1, 3)} "
                  f"{goal(rs, 0.5)} (goal <= 0.50).")
        print("\nwhere a step goes, rank 0, ms (median over the rounds): zero's engine split "
              "(forward + backward / waiting for reductions after backward / optimizer step / publishing "
              "parameters) and DeepSpeed's calls (forward / backward / step)\n")
        print("| ds_config | zero fwd+bwd | zero reduce wait | zero step | zero publish | DS forward | DS backward | DS step |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for label in labels:
            zl, dl = rows.get(("zero", world, label), []), rows.get(("deepspeed", world, label), [])
            part = lambda lines, key: statistics.median(l["split_s"][key] for l in lines) if lines else None
            fb = (part(zl, "forward") + part(zl, "backward")) if zl else None
            print(f"| {label} | {fmt(fb, 1e3)} | {fmt(part(zl, 'reduce'), 1e3)} | {fmt(part(zl, 'step'), 1e3)} | "
                  f"{fmt(part(zl, 'gather'), 1e3)} | {fmt(part(dl, 'forward'), 1e3)} | {fmt(part(dl, 'backward'), 1e3)} | "
                  f"{fmt(part(dl, 'step'), 1e3)} |")
        print()


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "configs":
        nvme = sys.argv[4] if len(sys.argv) >= 5 and sys.argv[3] == "--nvme" else ""
        configs(sys.argv[2], nvme)
    elif len(sys.argv) == 3 and sys.argv[1] == "report":
        report(sys.argv[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
