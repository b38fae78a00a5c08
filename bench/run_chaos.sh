#!/usr/bin/env bash
# A soak with random faults: trains the example GPT (zero-main) under
# `zero-run --max-restarts` while SIGKILLing a random rank at random times,
# chosen by a seed, and checks that the job ends where an uninterrupted run
# of the same steps ends, byte for byte. Each fault waits until the job is
# training again (a step after its resume), then a random 0.2-1.5 s. The
# program resumes by itself from its newest checkpoint (saved every K steps;
# Note [Restarts] in tools/launcher/launcher.cpp).
#
# With --in-memory K the program also keeps a copy of the training state in
# memory every K steps (checkpoint.in_memory: Note [In-memory copies] in
# engine/memory_copies.h), which a restart resumes from when it is newer:
# then at most K steps are lost a fault, whatever --save-every says.
#
# Usage: bench/run_chaos.sh [build dir] [--seed 1] [--faults 20] [--steps 1200] [--save-every 5] [--nproc 2]
#                           [--in-memory K]
#
# The last line printed is JSON: faults, restarts, steps_lost (total and
# max per fault, against the step each fault interrupted), seconds from
# each fault to the next completed step (median and max), the run's and
# the reference's wall time, and final_weights_equal. It is also appended
# to $RESULTS/chaos.jsonl (default bench/results). Exit status 1 when the
# weights differ, a fault cost more than K steps, or fewer faults than asked
# could be injected before the job ended (raise --steps).
# Faults are rank kills on one node; whole-node and link faults are not
# part of it yet.
set -euo pipefail
build="${1:-build}"
shift || true
here="$(cd "$(dirname "$0")" && pwd)"
results="${RESULTS:-$here/results}"
mkdir -p "$results"
seed=1 faults=20 steps=1200 save_every=5 nproc=2 in_memory=0
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed="$2" ;;
    --faults) faults="$2" ;;
    --steps) steps="$2" ;;
    --save-every) save_every="$2" ;;
    --nproc) nproc="$2" ;;
    --in-memory) in_memory="$2" ;;
    *) echo "run_chaos.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
run="$build/tools/launcher/zero-run"
program="$build/examples/zero-main"
for f in "$run" "$program"; do
  [ -x "$f" ] || { echo "run_chaos.sh: $f is missing; build first (tools/build.sh)" >&2; exit 2; }
done
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_chaos.XXXXXX")"
trap 'rm -rf "$work"' EXIT
train=(--steps "$steps" --expect-learning 0)
if [ "$in_memory" != 0 ]; then  # configs/main.json with checkpoint.in_memory.interval
  python3 - "$here/../configs/main.json" "$in_memory" > "$work/config.json" << 'EOF_CONFIG'
import json, sys
config = json.load(open(sys.argv[1]))
config.setdefault("checkpoint", {})["in_memory"] = {"interval": int(sys.argv[2])}
print(json.dumps(config, indent=2))
EOF_CONFIG
  train+=(--config "$work/config.json")
fi
k=$save_every
[ "$in_memory" = 0 ] || [ "$in_memory" -ge "$k" ] || k=$in_memory  # the newest copy is at most k steps old
now() { date +%s.%N; }

start="$(now)"
"$run" --nproc "$nproc" "$program" "${train[@]}" --final-weights "$work/reference.bin" > "$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; echo "run_chaos.sh: the uninterrupted run failed" >&2; exit 1; }
reference_s="$(python3 -c "print($(now) - $start)")"

# The soak: the launcher restarts every rank after each fault.
RANDOM="$seed"
log="$work/soak.log" steps_log="$work/steps.log" faults_log="$work/faults.log"
: > "$steps_log"
: > "$faults_log"
start="$(now)"
"$run" --nproc "$nproc" --max-restarts $((faults + 5)) "$program" "${train[@]}" --checkpoint "$work/ckpt" \
  --save-every "$save_every" --step-log "$steps_log" --final-weights "$work/soak.bin" > "$log" 2>&1 &
launcher=$!
last_step() { tail -n 1 "$steps_log" 2>/dev/null | cut -d' ' -f2; }
injected=0
while [ "$injected" -lt "$faults" ] && kill -0 "$launcher" 2> /dev/null; do
  # Training again: a step logged after the last fault.
  mark="$(wc -l < "$steps_log")"
  while kill -0 "$launcher" 2> /dev/null && [ "$(wc -l < "$steps_log")" -le "$mark" ]; do sleep 0.05; done
  sleep "$(python3 -c "import random; random.seed($seed * 1000 + $injected); print(random.uniform(0.2, 1.5))")"
  mapfile -t ranks < <(pgrep -P "$launcher" || true)
  [ "${#ranks[@]}" -gt 0 ] || continue
  victim="${ranks[$((RANDOM % ${#ranks[@]}))]}"
  step="$(last_step)"
  kill -KILL "$victim" 2> /dev/null || continue
  echo "$(now) ${step:-0} $victim" >> "$faults_log"
  injected=$((injected + 1))
done
status=0
wait "$launcher" || status=$?
soak_s="$(python3 -c "print($(now) - $start)")"
[ "$status" = 0 ] || { tail -n 30 "$log"; echo "run_chaos.sh: the soak ended with status $status" >&2; exit 1; }

python3 - "$faults" "$k" "$save_every" "$in_memory" "$steps" "$seed" "$reference_s" "$soak_s" "$faults_log" "$steps_log" "$log" \
  "$work/reference.bin" "$work/soak.bin" "$results/chaos.jsonl" << 'EOF_PY'
import json, re, statistics, sys
(asked, k, save_every, in_memory, steps, seed, reference_s, soak_s, faults_log, steps_log, log, ref_bin, soak_bin, out) = sys.argv[1:]
asked, k = int(asked), int(k)
faults = [(float(t), int(s)) for t, s, _ in (line.split() for line in open(faults_log))]
logged = [(int(s), float(t)) for _, s, t in (line.split() for line in open(steps_log))]
text = open(log).read()
resumed = {int(r): int(s) for s, r in re.findall(r"resuming at step (\d+) after restart (\d+) of", text)}
restarts = len(re.findall(r"restart \d+ of \d+: starting", text))
lost, to_step = [], []
for i, (t, at) in enumerate(faults):
    # Fault i made restart i + 1, which resumed from its newest checkpoint
    # (from step 0 when there was none yet: no resume is logged).
    back = resumed.get(i + 1, 0)
    lost.append(max(0, at - back))
    after = [lt for _, lt in logged if lt > t]
    to_step.append(after[0] - t if after else float("inf"))
equal = open(ref_bin, "rb").read() == open(soak_bin, "rb").read()
row = {"seed": int(seed), "faults": len(faults), "faults_asked": asked, "restarts": restarts, "steps": int(steps),
       "save_every": int(save_every), "in_memory_interval": int(in_memory), "k": k, "steps_lost_total": sum(lost), "steps_lost_max": max(lost, default=0),
       "fault_to_step_s_median": statistics.median(to_step) if to_step else 0.0,
       "fault_to_step_s_max": max(to_step, default=0.0), "soak_s": float(soak_s), "reference_s": float(reference_s),
       "final_weights_equal": equal}
print(f"{len(faults)} faults, {restarts} restarts, {sum(lost)} steps lost (at most {max(lost, default=0)} a fault, K = {k}); "
      f"fault to next step: median {row['fault_to_step_s_median']:.2f} s, max {row['fault_to_step_s_max']:.2f} s; "
      f"final weights {'equal' if equal else 'DIFFERENT'}", file=sys.stderr)
print(json.dumps(row, sort_keys=True))
with open(out, "a") as f:
    f.write(json.dumps(row, sort_keys=True) + "\n")
sys.exit(0 if equal and len(faults) >= asked and max(lost, default=0) <= k else 1)
EOF_PY
