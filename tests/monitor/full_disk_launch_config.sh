#!/usr/bin/env bash
# zero-run config --output on a full disk (a 64 KiB tmpfs filled up): exit 1
# naming the staging file and ENOSPC's text, no staging file left, the
# existing OUTPUT unchanged; a symlink planted at OUTPUT.tmp is replaced, not
# followed. Exit 77 (skipped) where a tmpfs cannot be mounted.
set -u
zero_run="$1"
dir=$(mktemp -d)
if ! mount -t tmpfs -o size=64k tmpfs "$dir" 2>/dev/null; then
  echo "skipped: cannot mount a tmpfs (run as root to test a full disk)"
  rmdir "$dir"
  exit 77
fi
trap 'umount "$dir"; rmdir "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
echo "kept" > "$dir/accel.yaml"
ln -s "$dir/victim" "$dir/accel.yaml.tmp"
dd if=/dev/zero of="$dir/filler" bs=4k 2>/dev/null
out=$("$zero_run" config --force --output "$dir/accel.yaml" 2>&1) && fail "succeeded on a full disk: $out"
echo "$out"
case "$out" in *"$dir/accel.yaml.tmp: No space left on device"*) ;; *) fail "the message names no file and errno" ;; esac
[ "$(cat "$dir/accel.yaml")" = kept ] || fail "the existing output changed"
[ ! -e "$dir/accel.yaml.tmp" ] && [ ! -L "$dir/accel.yaml.tmp" ] || fail "a staging file was left"
[ ! -e "$dir/victim" ] || fail "the planted symlink was followed"
rm "$dir/filler"
"$zero_run" config --force --output "$dir/accel.yaml" >/dev/null || fail "did not write with room on the disk"
grep -q "zero launch config" "$dir/accel.yaml" || fail "the output is not the launch config"
echo "ok"
