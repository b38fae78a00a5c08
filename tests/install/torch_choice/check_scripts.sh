#!/usr/bin/env bash
# The LibTorch choice in the tools scripts (tools/torch-choice.sh):
# - an unknown ZERO_TORCH is a one-line error that lists the choices;
# - a wheel install that cannot reach its packages names the package that
#   failed and the disk it needs, leaves no half-made venv behind, and does
#   not fall back to Debian's LibTorch.
# Usage: check_scripts.sh SOURCE_DIR WORK_DIR
set -uo pipefail
src=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
fail() { echo "FAILED: $*"; exit 1; }

for script in setup-deps.sh build.sh run-main.sh run-tests.sh; do
  out=$(ZERO_TORCH=conda bash "$src/tools/$script" 2>&1)
  rc=$?
  [ "$rc" = 2 ] || fail "$script with ZERO_TORCH=conda exited $rc, not 2: $out"
  [ "$(printf '%s\n' "$out" | wc -l)" = 1 ] || fail "$script: more than one line: $out"
  case "$out" in *"ZERO_TORCH=conda is not a choice; use debian"*"or wheel"*) ;; *) fail "$script: $out" ;; esac
done
echo "unknown ZERO_TORCH: one line, exit 2, from each script"

# No package index: pip is pointed at a closed local port (nothing leaves
# this machine), without retries.
venv="$work/venv"
out=$(ZERO_TORCH=wheel ZERO_VENV="$venv" PIP_INDEX_URL=http://127.0.0.1:9/simple PIP_FIND_LINKS= \
  PIP_RETRIES=0 PIP_TIMEOUT=2 bash "$src/tools/setup-deps.sh" 2>&1)
rc=$?
[ "$rc" != 0 ] || fail "setup-deps succeeded without a package index: $out"
[ ! -e "$venv" ] || fail "setup-deps left $venv behind"
last=$(printf '%s\n' "$out" | tail -n 1)
case "$last" in
  *"installing torch=="*"failed"*"needs about"*"GiB"*"GiB are free"*"was removed"*) ;;
  *) fail "the last line does not name torch and the disk: $last" ;;
esac
echo "no package index: $last"
