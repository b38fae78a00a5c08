#!/usr/bin/env bash
# checkpoint.in_memory (Note [In-memory copies] in engine/memory_copies.h) on
# one node, against an uninterrupted run without copies (final parameters
# byte for byte, so the copies change nothing):
#   1. zero-run --max-restarts: rank 1 killed in step 7 (disk checkpoint:
#      step 5, copy in memory: step 6); the restart resumes from the copy of
#      step 6, and zero-run's memory folder is gone when the job ends.
#   2. A rank killed in the middle of a copy (step 7's file written, the copy
#      not complete): the restart resumes from the whole copy of step 6.
#   3. The memory folder lost (as a node's reboot loses it): the disk's
#      step 5.
#   4. A copy that cannot be made (the folder is a file): a warning, and
#      training goes on to the same parameters.
#
#   bash tests/engine/in_memory_copies.sh [--run build/tools/launcher/zero-run] [--program build/tests/engine/fault_injection]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
run="$root/build/tools/launcher/zero-run"
program="$root/build/tests/engine/fault_injection"
while [ $# -gt 0 ]; do
  case "$1" in
    --run) run="$2" ;;
    --program) program="$2" ;;
    *) echo "in_memory_copies.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift 2
done
work="$(mktemp -d "${TMPDIR:-/tmp}/zero_in_memory.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
says() { grep -qF "$2" "$1" || { cat "$1"; fail "the log does not say: $2"; }; }
steps=20 save_every=5 stage=2 interval=1

"$run" --nproc 2 "$program" train "$work/reference" "$steps" "$save_every" "$stage" 0 >"$work/reference.log" 2>&1 ||
  { cat "$work/reference.log"; fail "the uninterrupted run failed"; }
same_as_reference() {
  cmp -s "$work/reference/final.bin" "$1/final.bin" || fail "$2: the final parameters differ from the uninterrupted run's"
}

# 1. A restart resumes from memory, one step behind the fault, not five.
status=0
"$run" --nproc 2 --max-restarts 2 bash -c \
  'echo "memory folder: $ZERO_MEMORY_CHECKPOINTS"; [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && export ZERO_FAULT=step.reduced:1:7; exec "$0" "$@"' \
  "$program" train "$work/restarted" "$steps" "$save_every" "$stage" "$interval" >"$work/restarted.log" 2>&1 || status=$?
[ "$status" = 0 ] || { cat "$work/restarted.log"; fail "the restarted job ended with status $status"; }
says "$work/restarted.log" "resuming from the in-memory copy of step 6 (the newest checkpoint in $work/restarted is step 5)"
says "$work/restarted.log" "resuming at step 6 after restart 1 of 2"
same_as_reference "$work/restarted" "restart"
folder=$(sed -n 's/.*memory folder: //p' "$work/restarted.log" | head -1)
case "$folder" in /dev/shm/zero-run.*) ;; *) cat "$work/restarted.log"; fail "zero-run did not make a memory folder in /dev/shm ($folder)" ;; esac
[ ! -e "$folder" ] || fail "zero-run left its memory folder $folder behind"

# 2. Killed in the middle of step 7's copy: the copy of step 6 is the newest whole one.
# save.written is reached once a copy (steps 1-7) and once at the disk saves of step 5.
export ZERO_MEMORY_CHECKPOINTS="$work/memory"
status=0
ZERO_FAULT=save.written:1:8 "$run" --nproc 2 "$program" train "$work/mid_copy" "$steps" "$save_every" "$stage" "$interval" \
  >"$work/mid_copy.log" 2>&1 || status=$?
[ "$status" = 137 ] || { cat "$work/mid_copy.log"; fail "the run killed during a copy ended with status $status, not 137"; }
cp -a "$work/mid_copy" "$work/folder_lost"
"$run" --nproc 2 "$program" train "$work/mid_copy" "$steps" "$save_every" "$stage" "$interval" >"$work/mid_copy2.log" 2>&1 ||
  { cat "$work/mid_copy2.log"; fail "the run after the fault during a copy failed"; }
says "$work/mid_copy2.log" "resuming from the in-memory copy of step 6"
same_as_reference "$work/mid_copy" "fault during a copy"

# 3. The memory folder lost with its node: the disk's checkpoint.
rm -rf "$ZERO_MEMORY_CHECKPOINTS"
"$run" --nproc 2 "$program" train "$work/folder_lost" "$steps" "$save_every" "$stage" "$interval" >"$work/folder_lost.log" 2>&1 ||
  { cat "$work/folder_lost.log"; fail "the run without its memory folder failed"; }
! grep -qF "in-memory copy" "$work/folder_lost.log" || { cat "$work/folder_lost.log"; fail "a copy was read after its folder was removed"; }
says "$work/folder_lost.log" "loaded $work/folder_lost/global_step5"
same_as_reference "$work/folder_lost" "memory folder lost"

# 4. A copy that cannot be made: warned, and the training is the same.
rm -rf "$ZERO_MEMORY_CHECKPOINTS"
echo "not a folder" >"$ZERO_MEMORY_CHECKPOINTS"
"$run" --nproc 2 "$program" train "$work/no_copies" "$steps" "$save_every" "$stage" "$interval" >"$work/no_copies.log" 2>&1 ||
  { cat "$work/no_copies.log"; fail "the run whose copies fail failed"; }
says "$work/no_copies.log" "the in-memory copy of step 1 was not made"
same_as_reference "$work/no_copies" "copies failing"
echo "in_memory_copies: a restart resumed from the copy of step 6 (disk: step 5), so did a run killed during step 7's copy; without the folder the disk's step 5; failing copies warned; every run ended with the uninterrupted run's parameters, byte for byte"
