#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, with ASan + UBSan) into build-fuzz and
# fuzzes each for a while, two at a time; new inputs that add coverage are
# merged into tests/fuzz/corpus/<target>, which every test run replays.
#
#   bash tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]   # default 600 s, all six
#
# Targets: config, launch_env, launch_yaml, manifest, safetensors, torch_save
# (tests/fuzz/). A crash, a leak, an allocation over 512 MB or an RSS over
# 2 GB stops a target; the input that did it is left in
# build-fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-600}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(config launch_env launch_yaml manifest safetensors torch_save)

bash tools/setup-deps.sh
command -v clang++ >/dev/null || { echo "fuzz.sh: clang++ not found (apt-get install clang)" >&2; exit 1; }
dir="${ZERO_FUZZ_DIR:-build-fuzz}"
flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize=vptr -fno-omit-frame-pointer"
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DZERO_FUZZ=ON \
  -DZERO_BUILD_BENCH=OFF -DZERO_BUILD_EXAMPLES=OFF -DCMAKE_CXX_FLAGS="$flags" >/dev/null
cmake --build "$dir" -j "${ZERO_JOBS:-$(nproc)}" --target "${targets[@]/#/fuzz_}"

export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
run() {
  local t="$1" work="$dir/work/$1" art="$dir/artifacts/$1/"
  mkdir -p "$work" "$art"
  "$dir/tests/fuzz/fuzz_$t" "$work" "tests/fuzz/corpus/$t" -dict="tests/fuzz/$t.dict" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -malloc_limit_mb=512 -max_len=65536 -timeout=10 \
    -artifact_prefix="$art" -print_final_stats=1 >"$dir/$t.log" 2>&1
  local status=$?
  # Keep the corpus small: only inputs that add coverage go into the repository.
  "$dir/tests/fuzz/fuzz_$t" -merge=1 -use_counters=0 "tests/fuzz/corpus/$t" "$work" >>"$dir/$t.log" 2>&1 || true
  echo "$t: exit $status, $(grep -o 'stat::number_of_executed_units: [0-9]*' "$dir/$t.log" | tail -1), log $dir/$t.log"
  return $status
}
status=0
for ((i = 0; i < ${#targets[@]}; i += 2)); do
  pids=()
  for t in "${targets[@]:i:2}"; do
    run "$t" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || status=1; done
done
exit $status
