#!/usr/bin/env bash
# The GPU lease, rehearsed on this CPU machine (CI runs it): what the lease
# will run, run here the same way, so that a lease fails only on what needs
# the GPU itself.
#   bash bench/gpu/rehearse.sh
# 1. builds the bundle (bench/gpu/bundle.sh: against torch 2.11.0 in .venv-gpu);
# 2. checks that the carried tree (tracked files + .gpu-bundle) fits the
#    lease's 64 MiB;
# 3. unpacks the bundle into a clean folder and resolves every program's and
#    library's shared libraries the way the lease does (the bundle's own, then
#    torch's): none "not found", none from this machine's Debian packages or
#    build folders, only the base system's glibc, libstdc++ and libgcc;
# 4. runs bench/gpu/run_all.sh with ZERO_GPU_REHEARSAL=1: every part, every
#    program, on the CPU at small sizes; every run must finish, and what it
#    leaves under OUT must fit what a lease sends back (8 files of 16 MiB);
# 5. the lease's refusals: a bundle built against another torch stops at
#    once naming both versions, and without a GPU every part is skipped
#    saying why.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
fail() { echo "rehearse: FAIL: $*" >&2; exit 1; }
start=$(date +%s)

bash bench/gpu/bundle.sh
bundle="$root/.gpu-bundle/zero-gpu.tar.gz"
python="${ZERO_GPU_VENV:-$root/.venv-gpu}/bin/python"

# 2. The carry limit.
limit=$(( 64 * 1024 * 1024 ))
tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}')
size=$(stat -c %s "$bundle")
echo "rehearse: carried: tree $(( tree / 1024 )) KiB + bundle $(( size / 1024 )) KiB of $(( limit / 1024 )) KiB"
[ $(( tree + size )) -le "$limit" ] || fail "the tree and the bundle ($(( (tree + size) / 1048576 )) MiB) pass the lease's 64 MiB"

# 3. Every shared library resolves, and only to the bundle, torch or the base system.
scratch=$(mktemp -d /tmp/zero-rehearse.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
tar -C "$scratch" -xzf "$bundle"
b="$scratch/zero-gpu"
. bench/gpu/torch_paths.sh
base='^(libc|libm|libdl|libpthread|librt|libresolv|ld-linux-x86-64|libstdc\+\+|libgcc_s|libutil)\.so'
bad=""
for f in "$b"/bin/* "$b"/lib/*; do
  while read -r name _ path _; do
    if [ "$path" = "not" ]; then bad+="$(basename "$f"): $name not found"$'\n'; continue; fi
    case "$path" in "$b"/* | "$site"/*) continue ;; esac
    [[ "$name" =~ $base ]] || bad+="$(basename "$f"): $name from $path (not in the bundle, not torch's, not the base system's)"$'\n'
  done < <(LD_LIBRARY_PATH="$torch_path" ldd "$f" | awk '$2 == "=>"')
done
[ -z "$bad" ] || fail "shared libraries the lease would miss:"$'\n'"$bad"
echo "rehearse: $(ls "$b/bin" | wc -l) programs and $(ls "$b/lib" | wc -l) libraries resolve to the bundle, torch $("$python" -c 'import torch; print(torch.__version__)') and the base system"

# 4. The lease's command, on the CPU.
out="$scratch/out"
ZERO_GPU_REHEARSAL=1 ZERO_GPU_PYTHON="$python" OUT="$out" ZERO_GPU_WORK="$scratch/work" \
  ZERO_GPU_NVME="$scratch/nvme" bash bench/gpu/run_all.sh || fail "run_all.sh exited $?"
failed=$(grep -v '"status": "done"' "$scratch/work/runs.jsonl" || true)
[ -z "$failed" ] || fail "runs that did not finish (their logs: $out/logs.tar.gz):"$'\n'"$failed"
"$python" - "$out/gpu.json" <<'EOF' || fail "gpu.json lacks rows"
import json, sys
d = json.load(open(sys.argv[1]))
missing = [n for n in ("speed_zero_stage2", "speed_zero_stage3", "speed_torch_plain", "speed_torch_fsdp2")
           if not next((r for r in d["speed"] if r["name"] == n and r.get("step_s_median")), None)]
missing += [r["name"] for r in d["larger"] if not r.get("step_s_median")]
missing += [] if len(d["peaks"]) == 2 and d["peaks_estimate"] else ["peaks"]
missing += [r["name"] for r in d["nvme"]["rows"] if not r.get("io_bound_s")]
missing += [] if len(d["correctness"]) >= 8 else ["correctness"]
if missing:
    sys.exit(f"rows without figures: {missing}")
EOF
files=$(find "$out" -type f | wc -l)
big=$(find "$out" -type f -size +16M)
[ "$files" -le 8 ] || fail "$files files under OUT; a lease sends back 8"
[ -z "$big" ] || fail "files over 16 MiB under OUT: $big"

# 5. Refusals.
mkdir -p "$scratch/other"
tar -C "$scratch/other" -xzf "$bundle"
sed -i 's/"torch": "[^"]*"/"torch": "2.10.0+cu128"/' "$scratch/other/zero-gpu/BUNDLE.json"
tar -C "$scratch/other" -czf "$scratch/other.tar.gz" zero-gpu
if message=$(ZERO_GPU_BUNDLE="$scratch/other.tar.gz" ZERO_GPU_PYTHON="$python" OUT="$scratch/out-other" bash bench/gpu/run_all.sh 2>&1); then
  fail "a bundle built against torch 2.10.0+cu128 ran beside torch 2.11"
fi
[[ "$message" == *"2.10.0+cu128"*"2.11.0"* ]] || fail "the refusal of another torch does not name both versions: $message"
CUDA_VISIBLE_DEVICES="" ZERO_GPU_PYTHON="$python" OUT="$scratch/out-nogpu" ZERO_GPU_WORK="$scratch/work-nogpu" \
  bash bench/gpu/run_all.sh >"$scratch/nogpu.log" 2>&1 || fail "run_all.sh without a GPU exited $?: $(tail -3 "$scratch/nogpu.log")"
skipped=$(grep -c '"status": "skipped: ' "$scratch/work-nogpu/runs.jsonl" || true)
[ "$skipped" = 5 ] || fail "without a GPU, $skipped of the 5 parts said why they were skipped"
echo "rehearse: passed in $(( $(date +%s) - start )) s: $files files back ($(du -sh "$out" | cut -f1)), $(wc -l <"$scratch/work/runs.jsonl") runs"
