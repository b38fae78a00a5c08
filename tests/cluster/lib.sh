# Sourced by the emulated-cluster tests after they set `run` (zero-run's
# path): root, fail, and one run of 2 emulated nodes x 2 ranks.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "FAIL: $*" >&2; exit 1; }

# cluster_run LOG TIME_LIMIT PROGRAM [ARGS...]: tools/netns-cluster.sh runs
# PROGRAM on 2 nodes x 2 ranks, its output into LOG. Exits 77 (skipped,
# saying why) where network namespaces cannot be made; fails, printing LOG,
# when the run fails.
cluster_run() {
  local log="$1" limit="$2" status=0
  shift 2
  bash "$root/tools/netns-cluster.sh" --zero-run "$run" --nodes 2 --nproc 2 --time-limit "$limit" -- "$@" \
    >"$log" 2>&1 || status=$?
  if [ "$status" = 77 ]; then
    grep -m1 SKIP "$log" >&2
    exit 77
  fi
  [ "$status" = 0 ] || { cat "$log"; fail "$(basename "$log" .log): the run failed (status $status)"; }
}

# losses LOG: the "step K loss ..." lines rank 0 printed.
losses() { grep -o 'step [0-9]* loss .*' "$1"; }
