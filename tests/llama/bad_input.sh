#!/usr/bin/env bash
# zero-llama's bad input: each case ends with one error naming what is
# wrong, before any step: a token id >= vocab_size (its byte offset),
# --ctx beyond max_position_embeddings, a config.json of another model
# type, a token file of an odd size, a weights folder missing a tensor;
# and train's options whose outcome is known at the start (Note [Refuse at
# the start]): --save-hf at stage 3 without the gather key, a save folder
# that cannot be made, a --load with no checkpoint; and absurd model sizes
# in config.json, named before anything is allocated (against the weights'
# headers, else against this machine's memory). None may train a step.
# Usage: bad_input.sh ZERO_LLAMA FIXTURE TOKENS WORK
set -uo pipefail
llama="$1" fixture="$2" tokens="$3" work="$4"
configs="$(cd "$(dirname "$0")" && pwd)/configs"
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
  if [[ "$out" == *"step 1 loss"* ]]; then
    echo "FAIL: $*: trained before refusing"; failures=$((failures + 1)); return
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
absurd() {  # absurd NAME KEY VALUE: the fixture with config.json's KEY set to VALUE
  mkdir -p "$work/$1" && ln -sf "$fixture/model.safetensors" "$work/$1/model.safetensors"
  sed "s/\"$2\": [0-9]*/\"$2\": $3/" "$fixture/config.json" > "$work/$1/config.json"
}
absurd huge_vocab vocab_size 1000000000000
expect "config.json: vocab_size, hidden_size make model.embed_tokens.weight [1000000000000, 32], but the weights in $work/huge_vocab hold [96, 32]" \
  eval --hf-dir "$work/huge_vocab" --tokens "$tokens" --ctx 16
absurd huge_hidden hidden_size 1099511627776
expect "vocab_size, hidden_size make model.embed_tokens.weight [96, 1099511627776], but the weights" \
  eval --hf-dir "$work/huge_hidden" --tokens "$tokens" --ctx 16
absurd huge_depth num_hidden_layers 1000000000000
expect "config.json: num_hidden_layers 1000000000000 and the layer sizes make a model of" \
  eval --hf-dir "$work/huge_depth" --tokens "$tokens" --ctx 16
train=(train --hf-dir "$fixture" --tokens "$tokens" --ctx 16 --steps 2)
expect '--save-hf at ZeRO stage 3 needs "stage3_gather_16bit_weights_on_model_save": true' \
  "${train[@]}" --config "$configs/stage3.json" --save-hf "$work/hf"
touch "$work/a_file"
expect "--save $work/a_file/ckpt: $work/a_file is not a folder" "${train[@]}" --config "$configs/stage2.json" --save "$work/a_file/ckpt"
expect "--save-hf $work/a_file: it is not a folder" "${train[@]}" --config "$configs/stage2.json" --save-hf "$work/a_file"
mkdir -p "$work/no_checkpoint"
expect "no $work/no_checkpoint/latest" "${train[@]}" --config "$configs/stage2.json" --load "$work/no_checkpoint"
expect "checkpoint directory $work/missing does not exist" "${train[@]}" --config "$configs/stage2.json" --load "$work/missing"
[ ! -e "$work/a_file/ckpt" ] && [ ! -e "$work/hf" ] || { echo "FAIL: a refused run wrote its output"; failures=$((failures + 1)); }
# A FIFO (or a link to one) as the token file or as config.json would block
# the read until a writer came: refused at once, naming it.
mkfifo "$work/tokens.fifo" && ln -s "$work/tokens.fifo" "$work/tokens_link.bin"
expect "$work/tokens.fifo is a FIFO, not a regular file" eval --hf-dir "$fixture" --tokens "$work/tokens.fifo" --ctx 16
expect "$work/tokens_link.bin is a FIFO, not a regular file" eval --hf-dir "$fixture" --tokens "$work/tokens_link.bin" --ctx 16
mkdir -p "$work/fifo_config" && ln -s "$fixture/model.safetensors" "$work/fifo_config/model.safetensors"
mkfifo "$work/fifo_config/config.json"
expect "config.json: it is not a regular file" eval --hf-dir "$work/fifo_config" --tokens "$tokens" --ctx 16
# --save-hf OUT where OUT/config.json is a link planted to a file outside:
# the link is replaced by the config, the outside file is left as it was.
mkdir -p "$work/planted" && echo "outside" > "$work/outside.txt" && ln -s "$work/outside.txt" "$work/planted/config.json"
if ! "$llama" "${train[@]}" --config "$configs/stage2.json" --save-hf "$work/planted" > "$work/planted.log" 2>&1; then
  echo "FAIL: training with --save-hf over a planted link failed:"; tail -3 "$work/planted.log"; failures=$((failures + 1))
elif [ "$(cat "$work/outside.txt")" != outside ] || [ -L "$work/planted/config.json" ] ||
     ! cmp -s "$work/planted/config.json" "$fixture/config.json"; then
  echo "FAIL: --save-hf wrote through the link planted at $work/planted/config.json"; failures=$((failures + 1))
else
  echo "ok: --save-hf replaced the planted link, the outside file unchanged"
fi
exit $failures
