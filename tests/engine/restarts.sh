#!/usr/bin/env bash
# zero-run --max-restarts (Note [Restarts] in tools/launcher/launcher.cpp):
# a rank killed mid-run is followed by a restart of every rank, the program
# resumes from its newest checkpoint by itself (load_checkpoint_if_present)
# and ends with the uninterrupted run's parameters, byte for byte; the log
# names the failed rank, the restart and the step resumed from. A fault on
# every start uses the budget up and the job ends with the rank's status.
# With --torchrun PATH the first case runs under torchrun --max-restarts
# instead (its agent store and its own restart messages); exit 77 (skipped)
# when PATH is not there.
#
#   bash tests/engine/restarts.sh [--run build/tools/launcher/zero-run] [--program build/tests/engine/fault_injection]
#                                 [--torchrun .venv/bin/torchrun]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
run="$root/build/tools/launcher/zero-run"
program="$root/build/tests/engine/fault_injection"
torchrun=""
while [ $# -gt 0 ]; do
  case "$1" in
    --run) run="$2" ;;
    --program) program="$2" ;;
    --torchrun) torchrun="$2" ;;
    *) echo "restarts.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
if [ -n "$torchrun" ] && [ ! -x "$torchrun" ]; then
  echo "SKIPPED: $torchrun is missing; tools/setup-deps.sh with ZERO_TORCH=wheel installs torch into .venv"
  exit 77
fi
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_restarts.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
steps=20 save_every=5

"$run" --nproc 2 "$program" train "$work/reference" "$steps" "$save_every" >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the uninterrupted run failed"; }

# Rank 1 is killed at its 7th step on the first start only (step 7; the
# newest checkpoint is step 5's).
launch=("$run" --nproc 2 --max-restarts 2)
[ -z "$torchrun" ] || launch=("$torchrun" --nproc-per-node 2 --max-restarts 2 --no-python)
status=0
"${launch[@]}" bash -c \
  '[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && export ZERO_FAULT=step.reduced:1:7; exec "$0" "$@"' \
  "$program" train "$work/restarted" "$steps" "$save_every" >"$work/restarted.log" 2>&1 || status=$?
[ "$status" = 0 ] || { cat "$work/restarted.log"; fail "the restarted job ended with status $status"; }
lines=("resuming at step 5 after restart 1 of 2")
[ -n "$torchrun" ] || lines+=("rank 1 was killed by SIGKILL" "restart 1 of 2: starting the 2 ranks again (TORCHELASTIC_RESTART_COUNT=1)")
for line in "${lines[@]}"; do
  grep -qF "$line" "$work/restarted.log" || { cat "$work/restarted.log"; fail "the log does not say: $line"; }
done
! grep -qF "after restart 2 of 2" "$work/restarted.log" || fail "a second restart with one failure"
cmp -s "$work/reference/final.bin" "$work/restarted/final.bin" ||
  fail "the restarted run's final parameters differ from the uninterrupted run's"
if [ -n "$torchrun" ]; then
  echo "restarts: under torchrun --max-restarts, a killed rank was restarted and resumed from step 5 to the uninterrupted run's parameters, byte for byte"
  exit 0
fi

# A fault on every start: one restart allowed, then the job ends with the
# killed rank's status and says how to go on.
status=0
ZERO_FAULT=step.reduced:0:3 "$run" --nproc 2 --max-restarts 1 "$program" train "$work/doomed" "$steps" "$save_every" \
  >"$work/doomed.log" 2>&1 || status=$?
[ "$status" = 137 ] || { cat "$work/doomed.log"; fail "the job with a fault on every start ended with status $status, not 137"; }
[ "$(grep -c "rank 0 was killed by SIGKILL" "$work/doomed.log")" = 2 ] || { cat "$work/doomed.log"; fail "not two starts"; }
grep -qF "the ranks failed after 1 restart(s), all that --max-restarts 1 allows" "$work/doomed.log" ||
  { cat "$work/doomed.log"; fail "the end of the restart budget is not named"; }
echo "restarts: a killed rank was restarted and resumed from step 5 to the uninterrupted run's parameters, byte for byte; a fault on every start ended the job after its one restart"
