#!/usr/bin/env bash
# Stage 3 with a reuse distance that releases (stage3_max_reuse_distance 0)
# peaks no higher than stage 2 on the 42.6 M example GPT, fp32, 2 ranks:
# each stage in processes of its own (peak RSS is a per-process high-water
# mark), through bench_memory_peaks. The engine's own accounting is checked
# too: stage 3's held model states plus the most it gathered at once stay
# below stage 2's held states. At DeepSpeed's default reuse distance (1e9)
# stage 3 keeps forward's units gathered into backward and peaks above
# stage 2 (bench/run_memory_peaks.sh shows both rows).
#   stage3_peak.sh ZERO_RUN BENCH_MEMORY_PEAKS
set -euo pipefail
run="$1" bench="$2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
model=(--depth 6 --width 768 --heads 12 --context 64 --micro 2 --steps 2 --dtype fp32)
"$run" --nproc 2 "$bench" --stage 2 --out "$out/peaks.jsonl" "${model[@]}"
"$run" --nproc 2 "$bench" --stage 3 --reuse 0 --out "$out/peaks.jsonl" "${model[@]}"
python3 - "$out/peaks.jsonl" <<'PY'
import json, sys
stage2, stage3 = [json.loads(line) for line in open(sys.argv[1])]
assert stage3["stage3_max_reuse_distance"] == 0, stage3
mib = 1 << 20
def peak(run):  # the rank that needs the most
    return max(r["peak_rss"] for r in run["ranks"])
def held(run, gathered):
    return max(r["held"]["model_states"] + (r["gathered_peak"] if gathered else 0) for r in run["ranks"])
print(f"{stage2['params']} parameters: peak RSS stage 2 {peak(stage2) / mib:.1f} MiB, "
      f"stage 3 (reuse 0) {peak(stage3) / mib:.1f} MiB; held stage 2 {held(stage2, False) / mib:.1f} MiB, "
      f"stage 3 held + gathered {held(stage3, True) / mib:.1f} MiB")
failed = []
if held(stage3, True) > held(stage2, False):
    failed.append("stage 3's held states plus its gathered units exceed stage 2's held states")
if peak(stage3) > peak(stage2):
    failed.append("stage 3 with stage3_max_reuse_distance 0 peaks above stage 2")
for f in failed:
    print("FAILED:", f)
sys.exit(1 if failed else 0)
PY
