#!/usr/bin/env bash
# zero-llama train with Ulysses sequence parallelism against zero-llama on
# one rank, the same global batch (CONFIG's micro-batch on every sp rank of
# one replica; the one rank gets CONFIG without sequence_parallel_size):
# every step's loss and gradient norm within 1e-6 relative. SP_ARGS: more
# zero-llama options for the sequence-parallel run (--tiles, --attention-block).
# REF_NPROC: ranks of the reference run (1); with tensor parallelism in
# CONFIG, its tp ranks (the reference then has the same tp, without sp).
# Usage: sp_train_matches_one_rank.sh ZERO_RUN ZERO_LLAMA FIXTURE TOKENS CONFIG NPROC STEPS WORK
set -euo pipefail
zero_run="$1" llama="$2" fixture="$3" tokens="$4" config="$5" nproc="$6" steps="$7" work="$8"
rm -rf "$work" && mkdir -p "$work"
# The one-rank config: the same, without the key (sed: python3 may lack nothing, but keep it to coreutils).
grep -v '"sequence_parallel_size"' "$config" | sed -z 's/,\n}/\n}/' > "$work/one_rank.json"
run() {  # NPROC CONFIG OUT [OPTIONS...]
  "$zero_run" --nproc "$1" "$llama" train --hf-dir "$fixture" --config "$2" --tokens "$tokens" --ctx 16 \
    --steps "$steps" "${@:4}" | sed -n 's/^\(\[rank 0\] \)\{0,1\}\(step .*\)/\2/p' > "$3"
}
# shellcheck disable=SC2086  # SP_ARGS is a list of options
run "$nproc" "$config" "$work/sp.txt" ${SP_ARGS:-}
run "${REF_NPROC:-1}" "$work/one_rank.json" "$work/one.txt"
echo "step | loss at sp $nproc | loss on one rank | grad_norm at sp | on one rank"
paste -d' ' "$work/sp.txt" "$work/one.txt" | awk -v steps="$steps" '
  function rel(a, b) { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; return d / b }
  { n++; l = rel($4, $12); g = rel($6, $14); if (l > wl) wl = l; if (g > wg) wg = g
    printf "%4d %.10f %.10f %.10f %.10f\n", $2, $4, $12, $6, $14 }
  END { printf "%d steps; largest relative differences %.2e (losses), %.2e (norms)\n", n, wl, wg
        if (n != steps || wl > 1e-6 || wg > 1e-6) { print "FAIL: not within 1e-6"; exit 1 } }'
