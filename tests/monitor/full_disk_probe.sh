#!/usr/bin/env bash
# The issue's two cases through the launcher (full_disk_probe.cpp on 2
# ranks): csv_monitor on a disk full from the start, and on one that fills
# after step 5. Each job must end with a non-zero status in under 30 s (a
# fail-safe bound), the first line to say so coming from rank 0 (which hit
# it), and every rank's message naming the CSV file and ENOSPC's text.
# Exit 77 (skipped) where a tmpfs cannot be mounted.
set -u
zero_run="$1" probe="$2"
dir=$(mktemp -d)
if ! mount -t tmpfs -o size=1m tmpfs "$dir" 2>/dev/null; then
  echo "skipped: cannot mount a tmpfs (run as root to test a full disk)"
  rmdir "$dir"
  exit 77
fi
trap 'umount "$dir"; rmdir "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
for case in start mid; do
  rm -rf "${dir:?}"/*
  if [ $case = start ]; then
    dd if=/dev/zero of="$dir/filler" bs=4k 2>/dev/null
    args=()
  else
    args=(5)
  fi
  start=$(date +%s.%N)
  out=$(ZERO_COMM_TIMEOUT=60 timeout 120 "$zero_run" --nproc 2 "$probe" "$dir" "${args[@]}" 2>&1)
  rc=$?
  took=$(echo "$(date +%s.%N) - $start" | bc)
  echo "== csv_monitor, disk full $([ $case = start ] && echo "from the start" || echo "after step 5"): exit $rc after $took s"
  echo "$out" | grep -v "^\[rank [01]\] *$" | grep -i "space\|zero-run\|terminate" | head -12
  [ $rc -ne 0 ] || fail "$case: the job succeeded"
  [ "$(echo "$took < 30" | bc)" = 1 ] || fail "$case: the job took $took s"
  first=$(echo "$out" | grep -m1 "No space left on device")
  case "$first" in *"zero.write error: csv_monitor: writing $dir/run/"*) ;; *) fail "$case: the first line is not rank 0's naming the file: $first" ;; esac
  for r in 0 1; do
    echo "$out" | grep -q "rank $r.*csv_monitor: writing $dir/run/.*No space left on device" ||
      echo "$out" | grep -q "^\[rank $r\] .*csv_monitor: writing $dir/run/.*No space left on device" ||
      fail "$case: rank $r's error does not name the file"
  done
done
echo "ok"
