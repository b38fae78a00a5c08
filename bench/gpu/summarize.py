"""The GPU table from what bench/gpu/run_all.sh measured: reads its work
folder (machine.json, runs.jsonl, rows/*.jsonl, logs/) and writes gpu.json
(every figure) and summary.txt (the table with the goals).

    python3 bench/gpu/summarize.py --work DIR --json gpu.json --summary summary.txt

Formulas, so that the figures can be checked by hand:
- MFU: (6 P + 12 L T w) FLOPs per token (PaLM's count: the weights' matrix
  products forward and backward, plus attention's scores and values at
  context T, depth L, width w) times the tokens of a step, over the step
  time and the device's dense bf16 peak (profile/device_peak.h, as
  bench_offload_headline reports it).
- NVMe I/O per step at stage 3 with P parameters: offload_optimizer nvme
  reads and writes the fp32 master weights and AdamW's two moments (12 P
  bytes each way); offload_param nvme also reads the bf16 parameters in
  forward and in backward and writes them after the step (4 P read, 2 P
  written). The serial bound is reads / read rate + writes / write rate,
  the rates dd's (O_DIRECT, 1 MiB blocks) in the same run.
"""
import argparse
import glob
import json
import os
import re


def load_rows(work, name):
    path = os.path.join(work, "rows", name + ".jsonl")
    rows = []
    if os.path.exists(path):
        for line in open(path):
            line = line.strip()
            if line:
                j = json.loads(line)
                rows.append(j.get("result", j))
    return rows


def flops_per_step(r):
    tokens = r["tokens_per_step"]
    return (6 * r["params"] + 12 * r["depth"] * r["context"] * r["width"]) * tokens


def dd_rate(work, name):
    """Bytes per second from dd's last line ("... bytes ... copied, 1.2 s, 1.3 GB/s")."""
    path = os.path.join(work, "logs", name + ".log")
    if not os.path.exists(path):
        return None
    m = re.search(r"^(\d+) bytes .* copied, ([0-9.]+) s", open(path).read(), re.M)
    return int(m.group(1)) / float(m.group(2)) if m and float(m.group(2)) > 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--summary", required=True)
    a = ap.parse_args()
    w = a.work
    machine = json.load(open(os.path.join(w, "machine.json"))) if os.path.exists(os.path.join(w, "machine.json")) else {}
    bundle = json.load(open(os.path.join(w, "zero-gpu", "BUNDLE.json")))
    runs = [json.loads(l) for l in open(os.path.join(w, "runs.jsonl")) if l.strip()]
    status = {r["name"]: r for r in runs}
    lines = []
    say = lines.append
    gpu = machine.get("gpu") or {}
    say(f"GPU table: {gpu.get('name', 'no GPU')}, torch {machine.get('torch')}, driver {machine.get('driver') or '?'}, "
        f"bundle {bundle['commit'][:10]} (torch {bundle['torch']}){' REHEARSAL on the CPU: figures mean nothing' if machine.get('rehearsal') else ''}")
    for r in runs:
        if r["status"].startswith("skipped") or r["status"].startswith("not started"):
            say(f"  {r['part']}/{r['name']}: {r['status']}")

    # Correctness: each test run's gtest counts.
    correctness = [{"name": r["name"], "status": r["status"], "tests": r.get("tests", ""), "seconds": r.get("seconds")}
                   for r in runs if r["part"] == "correctness" and r["name"] != "correctness"]
    if correctness:
        say("\nCUDA correctness (gtest counts of rank 0; gloo ranks share the one GPU):")
        for c in correctness:
            say(f"  {c['name']:<22} {c['status']:<12} {c['tests']}")

    def row(name):
        rs = load_rows(w, name)
        if not rs:
            return {"name": name, "status": status.get(name, {}).get("status", "not run")}
        r = dict(rs[-1], name=name, status=status.get(name, {}).get("status", ""))
        if not r.get("oom") and r.get("step_s_median"):
            r["tflops_per_s"] = flops_per_step(r) / r["step_s_median"] / 1e12
        return r

    def peak_of(rows):
        return next((r.get("peak_flops") for r in rows if r.get("peak_flops")), 0)

    # Speed at world 1.
    speed = [row(n) for n in ("speed_torch_plain", "speed_torch_fsdp2", "speed_zero_stage0", "speed_zero_stage1",
                              "speed_zero_stage2", "speed_zero_stage3")]
    peak = peak_of(speed)
    plain = next((r for r in speed if r["name"] == "speed_torch_plain" and r.get("step_s_median")), None)
    goals = {"speed_zero_stage2": 1.05, "speed_zero_stage3": 1.2}
    if any(r.get("params") for r in speed):
        p = next(r for r in speed if r.get("params"))
        say(f"\nSpeed, world 1: GPT {p['params'] / 1e9:.2f} B, bf16, {p['tokens_per_step']} tokens a step "
            f"(MFU over {peak / 1e12:.0f} TFLOP/s dense bf16):")
    for r in speed:
        if r.get("params") is None:
            continue
        if peak and r.get("tflops_per_s"):
            r["mfu"] = r["tflops_per_s"] * 1e12 / peak
        if plain and r.get("step_s_median"):
            r["x_plain"] = r["step_s_median"] / plain["step_s_median"]
            if r["name"] in goals:
                r["goal_x_plain"] = goals[r["name"]]
        say(f"  {r['name']:<20} " + ("OOM " + r.get("oom_phase", "") if r.get("oom") else
            f"{r.get('step_s_median', float('nan')):.3f} s/step  MFU {r.get('mfu', float('nan')):.3f}  "
            f"x plain {r.get('x_plain', float('nan')):.3f}{'  (goal <= %.2f)' % r['goal_x_plain'] if 'goal_x_plain' in r else ''}  "
            f"GPU peak {r.get('device_peak_bytes', -1) / 1e9:.1f} GB"))

    # Larger than the GPU.
    larger = [row(n) for n in ("large_zero_offload", "large_zero_ratio", "large_fsdp2_offload")]
    fsdp = next((r for r in larger if r["name"] == "large_fsdp2_offload" and r.get("step_s_median")), None)
    if any(r.get("params") for r in larger):
        p = next(r for r in larger if r.get("params"))
        say(f"\nLarger than the GPU: GPT {p['params'] / 1e9:.2f} B, allocator capped at {p.get('cap_bytes', 0) / 1e9:.0f} GB "
            "(goal: <= 2.5 s a step, or >= 4x faster than FSDP2 + CPUOffloadPolicy):")
    for r in larger:
        if r.get("params") is None:
            continue
        if fsdp and r.get("step_s_median") and r is not fsdp:
            r["fsdp2_over_zero"] = fsdp["step_s_median"] / r["step_s_median"]
        say(f"  {r['name']:<20} " + ("OOM " + r.get("oom_phase", "") if r.get("oom") else
            f"{r.get('step_s_median', float('nan')):.3f} s/step"
            f"{'  FSDP2/zero %.2fx' % r['fsdp2_over_zero'] if 'fsdp2_over_zero' in r else ''}  "
            f"GPU peak {r.get('device_peak_bytes', -1) / 1e9:.1f} GB  host peak {r.get('host_peak_rss_bytes', -1) / 1e9:.1f} GB"))

    # Stage 2 vs 3 peaks beside the estimate.
    peaks = []
    estimate = None
    est_log = os.path.join(w, "logs", "peaks_estimate.log")
    if os.path.exists(est_log):
        try:
            estimate = json.loads(open(est_log).read())
        except ValueError:
            estimate = None
    for s in (2, 3):
        for r in load_rows(w, f"peaks_stage{s}"):
            peaks.append({"stage": s, "params": r["params"], "world": r["world"],
                          "estimate_model_states": sum(v for v in r["estimate"].values() if isinstance(v, (int, float)) and v > 0),
                          "ranks": [{"rank": k["rank"], "cuda_peak": k["cuda_peak"], "held": k["held"]} for k in r["ranks"]]})
    if peaks:
        say(f"\nStage 2 vs 3, CUDA allocator peak per rank ({peaks[0]['world']} gloo ranks on one GPU, "
            f"{peaks[0]['params'] / 1e9:.2f} B, bf16; estimate: model states on the device):")
        for p in peaks:
            cp = [k["cuda_peak"] for k in p["ranks"] if k["cuda_peak"] is not None]
            say(f"  stage {p['stage']}: peak {max(cp) / 2**20 if cp else float('nan'):.0f} MiB, "
                f"estimate {p['estimate_model_states'] / 2**20:.0f} MiB")

    # NVMe.
    read_bw, write_bw = dd_rate(w, "disk_read"), dd_rate(w, "disk_write")
    nvme = {"disk_read_bytes_per_s": read_bw, "disk_write_bytes_per_s": write_bw, "rows": []}
    for name, extra_read, extra_write in (("nvme_nvme", 0, 0), ("nvme_nvme_param", 4, 2)):
        r = row(name)
        if r.get("params") and read_bw and write_bw:
            reads, writes = (12 + extra_read) * r["params"], (12 + extra_write) * r["params"]
            r["io_bytes_read"], r["io_bytes_written"] = reads, writes
            r["io_bound_s"] = reads / read_bw + writes / write_bw
            if r.get("step_s_median"):
                r["x_io_bound"] = r["step_s_median"] / r["io_bound_s"]
        nvme["rows"].append(r)
    if read_bw or any(r.get("params") for r in nvme["rows"]):
        say(f"\nNVMe offload at stage 3 (dd O_DIRECT: read {(read_bw or 0) / 1e9:.2f} GB/s, write {(write_bw or 0) / 1e9:.2f} GB/s):")
        for r in nvme["rows"]:
            if r.get("params") is None:
                continue
            say(f"  {r['name']:<20} " + ("OOM" if r.get("oom") else
                f"{r.get('step_s_median', float('nan')):.2f} s/step, I/O bound {r.get('io_bound_s', float('nan')):.2f} s "
                f"(x {r.get('x_io_bound', float('nan')):.2f}), nvme_wait {r.get('split_s', {}).get('nvme_wait', float('nan')):.2f} s"))

    doc = {"machine": machine, "bundle": bundle, "runs": runs, "correctness": correctness, "speed": speed,
           "larger": larger, "peaks": peaks, "peaks_estimate": estimate, "nvme": nvme}
    json.dump(doc, open(a.json, "w"), indent=1)
    open(a.summary, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
