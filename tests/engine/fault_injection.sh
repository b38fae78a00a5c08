#!/usr/bin/env bash
# Kills ranks at seeded random points of save, load and step, resumes from
# the newest complete checkpoint each time, and checks that the final
# parameters equal an uninterrupted run's byte for byte.
#
#   bash tests/engine/fault_injection.sh [--run build/tools/launcher/zero-run]
#       [--program build/tests/engine/fault_injection] [--seed N] [--iterations K]
#       [--steps S] [--save-every E] [--nproc P] [--stage Z]
#
# Each iteration trains one run to S steps through up to 3 kills: a kill
# must end the job with a non-zero status within 30 s, the launcher naming
# the killed rank; the next attempt resumes. The soak is the same with
# more: --iterations 100 --steps 2000 --save-every 50.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
run="$root/build/tools/launcher/zero-run"
program="$root/build/tests/engine/fault_injection"
seed=1 iterations=3 steps=40 save_every=5 nproc=2 stage=2
while [ $# -gt 0 ]; do
  case "$1" in
    --run) run="$2" ;;
    --program) program="$2" ;;
    --seed) seed="$2" ;;
    --iterations) iterations="$2" ;;
    --steps) steps="$2" ;;
    --save-every) save_every="$2" ;;
    --nproc) nproc="$2" ;;
    --stage) stage="$2" ;;
    *) echo "fault_injection.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
RANDOM=$seed
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_faults.XXXXXX")"
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

"$run" --nproc "$nproc" "$program" train "$work/reference" "$steps" "$save_every" "$stage" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the uninterrupted run failed"; }

points=(save.written save.finishing load.read step.reduced)
kills=0 resumes=0
for ((i = 1; i <= iterations; ++i)); do
  dir="$work/run$i"
  for ((attempt = 1; attempt <= 3; ++attempt)); do
    point=${points[RANDOM % ${#points[@]}]}
    rank=$((RANDOM % nproc))
    case "$point" in
      save.finishing) rank=0; nth=$((1 + RANDOM % (steps / save_every))) ;;
      save.written) nth=$((1 + RANDOM % (steps / save_every))) ;;
      load.read) nth=1 ;;
      step.reduced) nth=$((1 + RANDOM % steps)) ;;
    esac
    log="$dir.attempt$attempt.log"
    start=$(date +%s%N)
    status=0
    ZERO_FAULT="$point:$rank:$nth" "$run" --nproc "$nproc" "$program" train "$dir" "$steps" "$save_every" "$stage" \
      >"$log" 2>&1 || status=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    if [ "$status" = 0 ]; then
      echo "iteration $i attempt $attempt: $point:$rank:$nth not reached (the run finished)"
      break
    fi
    kills=$((kills + 1))
    grep -q "rank $rank was killed by SIGKILL" "$log" || { cat "$log"; fail "$point:$rank:$nth: the launcher did not name rank $rank"; }
    [ "$ms" -lt 30000 ] || fail "$point:$rank:$nth: the job took $ms ms to stop"
    echo "iteration $i attempt $attempt: killed rank $rank at $point #$nth; the job ended after $ms ms"
  done
  if [ ! -f "$dir/final.bin" ]; then
    resumes=$((resumes + 1))
    "$run" --nproc "$nproc" "$program" train "$dir" "$steps" "$save_every" "$stage" >"$dir.resume.log" 2>&1 ||
      { cat "$dir.resume.log"; fail "iteration $i: the resumed run failed"; }
  fi
  cmp -s "$work/reference/final.bin" "$dir/final.bin" ||
    fail "iteration $i: the final parameters differ from the uninterrupted run's"
  rm -rf "$dir"
done
echo "fault_injection: $kills kills, $resumes resumes, $iterations runs ended with the uninterrupted run's parameters, byte for byte (seed $seed)"
