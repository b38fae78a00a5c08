#!/usr/bin/env bash
# Builds zero with a sanitizer into its own folder and runs tests there.
#
#   bash tools/sanitize.sh address          # ASan + UBSan: library, tools, whole suite (build-asan)
#   bash tools/sanitize.sh address --quick  # ASan + UBSan: the torch-free half (config, checkpoint
#                                           #   format, fuzz corpora), a few minutes; what CI runs
#   bash tools/sanitize.sh address --hardening  # ASan + UBSan over the bad-input tests: checkpoints
#                                           #   (hostile, killed, concurrent, full disk), launcher and
#                                           #   launch configs, checked collectives, monitors, the token
#                                           #   file, zero-llama's inputs, DeepSpeed imports (build-asan)
#   bash tools/sanitize.sh thread           # TSan: comm thread, NVMe swapper, stage-3 prefetch (build-tsan)
#
# Extra arguments go to ctest (e.g. -R zero.). Any sanitizer report fails
# the test that printed it: errors halt the process with a non-zero status.
# LibTorch itself is not instrumented: ASan and UBSan see zero's code and
# every allocation, TSan sees zero's memory accesses and all pthread
# synchronization (tools/sanitizers/tsan.supp lists what it cannot see).
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/torch-choice.sh
# Each LibTorch gets its own sanitizer folders (build-asan, build-wheel-asan, ...).
prefix=build
[ "$zero_torch" = wheel ] && prefix=build-wheel
kind="${1:-address}"
shift || true
quick=0 hardening=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
elif [ "${1:-}" = "--hardening" ]; then
  hardening=1
  shift
fi

case "$kind" in
  address)
    dir="${ZERO_SANITIZE_DIR:-$prefix-asan}"
    [ "$quick" = 0 ] || dir="${ZERO_SANITIZE_DIR:-$prefix-asan-quick}"
    flags="-fsanitize=address,undefined -fno-sanitize=vptr -fno-omit-frame-pointer"
    # The torch-free half: config parser, checkpoint format and tools, the
    # torch.save reader and DeepSpeed's folders in and out, the monitors' writer thread, the
    # environment's log settings, fuzz corpora.
    quick_targets=(test_config test_ckpt_format test_torchsave test_interop test_monitor_writer test_env_settings zero-ckpt zero-config fuzz_replay)
    # The bad-input tests of the hardening and full-disk work, with LibTorch.
    hardening_targets=(zero-run zero-ckpt zero-config launcher_probe test_launcher test_launch_config test_launch_env
                       accelerate_train test_config test_ckpt_format test_checkpoint ckpt_killed_save ckpt_concurrent_saver
                       test_torchsave test_interop test_monitor_writer test_monitors test_comms_logger test_full_disk
                       full_disk_probe test_progress test_env_settings test_collectives comm_faults fuzz_replay
                       zero-llama test_data)
    hardening_tests='^(config\.|core\.(Progress|LogRanks|LogLevel|FaultHook)\.|ckpt\.|torchsave\.|interop\.(ImportDeepSpeed|ExportDeepSpeed|ExportHf)\.|monitor\.(MonitorWriter\.|monitors|comms_logger|full_disk)|launcher\.|accelerate\.|comm\.(collectives\.gloo|faults\.gloo\.checked|launch_env)|fuzz\.|data\.TokenDataset\.|llama\.bad_input|interop\.import_counts_beyond_a_run)'
    quick_tests='^(config\.|ckpt\.(CkptTest|Manifest|Dtypes|WeightFilesTest|python_reader)|torchsave\.|interop\.(ImportDeepSpeed|ExportDeepSpeed|ExportHf)\.|monitor\.MonitorWriter\.|core\.(LogRanks|LogLevel|FaultHook)\.|fuzz\.)'
    ;;
  thread)
    dir="${ZERO_SANITIZE_DIR:-$prefix-tsan}"
    flags="-fsanitize=thread -fno-omit-frame-pointer"
    ;;
  *)
    echo "usage: bash tools/sanitize.sh address [--quick | --hardening] | thread  [ctest args]" >&2
    exit 2
    ;;
esac

bash tools/setup-deps.sh
jobs="${ZERO_JOBS:-$(nproc)}"
# Benchmarks measure speed, which a sanitizer distorts: not built.
cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZERO_BUILD_BENCH=OFF -DZERO_TORCH_PYTHON="$zero_python" \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null

supp="$PWD/tools/sanitizers"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:halt_on_error=1:detect_stack_use_after_return=0"
export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$supp/ubsan.supp"
export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
# Slower under a sanitizer: the collectives' timeout stays well inside ctest's.
export ZERO_COMM_TIMEOUT="${ZERO_COMM_TIMEOUT:-120}"
# A sanitizer replaces malloc itself: zero-run must not preload another allocator.
export ZERO_ALLOCATOR=system

cd "$dir"
if [ "$kind" = thread ]; then
  # The comm thread (collectives, faults), the NVMe swapper, the stage-3 prefetch (param_storage).
  cmake --build . -j "$jobs" --target zero-run test_collectives comm_faults test_swapper test_param_storage
  exec ctest --output-on-failure --timeout 600 -j "${ZERO_TEST_JOBS:-2}" \
    -R '^(comm\.collectives|comm\.faults|offload\.Swap|zero\.param_storage)' "$@"
elif [ "$hardening" = 1 ]; then
  cmake --build . -j "$jobs" --target "${hardening_targets[@]}"
  exec ctest --output-on-failure --timeout 600 -j "${ZERO_TEST_JOBS:-2}" -R "$hardening_tests" "$@"
elif [ "$quick" = 1 ]; then
  cmake --build . -j "$jobs" --target "${quick_targets[@]}"
  exec ctest --output-on-failure --timeout 600 -j "${ZERO_TEST_JOBS:-2}" -R "$quick_tests" "$@"
else
  cmake --build . -j "$jobs"
  exec ctest --output-on-failure --timeout 600 -j "${ZERO_TEST_JOBS:-2}" "$@"
fi
