#!/usr/bin/env bash
# zero-llama's bad input: each case ends with one error naming what is
# wrong, before any step: a token id >= vocab_size (its byte offset),
# --ctx beyond max_position_embeddings, a config.json of another model
# type, a token file of an odd size, a weights folder missing a tensor.
# Usage: bad_input.sh ZERO_LLAMA FIXTURE TOKENS WORK
set -uo pipefail
llama="$1" fixture="$2" tokens="$3" work="$4"
rm -rf "$work" && mkdir -p "$work"
failures=0
expect() {  # expect NEEDLE ARGS...: the run fails and its error holds NEEDLE
  local needle="$1"; shift
  local out
  if out="$("$llama" "$@" 2>&1)"; then
    echo "FAIL: $* succeeded; expected an error with: $needle"; failures=$((failures + 1)); return
  fi
  if [[ "$out" != *"$needle"* ]]; then
    echo "FAIL: $*: the error does not say \"$needle\":"; echo "$out" | tail -3; failures=$((failures + 1)); return
  fi
  echo "ok: ${out##*$'\n'}"
}
cp "$tokens" "$work/bad_id.bin"
printf '\xe8\x03' | dd of="$work/bad_id.bin" bs=1 seek=40 conv=notrunc status=none  # id 1000 at byte 40
expect "holds id 1000 at byte offset 40, not below the model's vocab_size 96" eval --hf-dir "$fixture" --tokens "$work/bad_id.bin" --ctx 16
expect "--ctx 65 is beyond the model's max_position_embeddings 64" eval --hf-dir "$fixture" --tokens "$tokens" --ctx 65
head -c 201 "$tokens" > "$work/odd.bin"
expect "has 201 bytes, not a multiple of 2" eval --hf-dir "$fixture" --tokens "$work/odd.bin" --ctx 16
mkdir -p "$work/mistral" && sed 's/"llama"/"mistral"/' "$fixture/config.json" > "$work/mistral/config.json"
expect "\"model_type\" is \"mistral\"" eval --hf-dir "$work/mistral" --tokens "$tokens" --ctx 16
exit $failures
