#!/usr/bin/env bash
# The rules about layers that ARCHITECTURE.md states, checked on the code.
#
#  1. Public headers. include/zero/ holds three kinds: the foundation every
#     layer may use, the public types a layer below the engine implements,
#     and the façade a program includes. Below the engine no folder includes
#     a façade header (except the one it implements), and no foundation or
#     public-type header includes one, so none arrives indirectly either.
#  2. Errors. Every throw in the library throws the subclass of zero::Error
#     that names what the user must look at to fix it, from the set its
#     folder is allowed. A throw of anything else (a rethrow `throw;` aside)
#     carries `// not a zero::Error: <why>` on its line or the line above.
#  3. Torch-free objects. The object libraries (add_library(x OBJECT), the
#     precompiled torch header's aside) and the tools zero-config, zero-ckpt
#     and zero-run build without LibTorch, so nothing they include, directly or through the project's
#     own headers, is a LibTorch header (torch/, ATen/, c10/). Debian's
#     LibTorch sits in /usr/include, where a slip compiles anyway; the GPU
#     machine's does not.
#  4. engine/ is the top of the library: no other library folder includes a
#     header of engine/ (what the engine and a lower folder share lives in
#     the lower one). The library folders are every top-level folder but
#     those in not_library below and build folders, so a new folder is
#     under the rule from its first file.
#  5. Size. A library source over 400 lines says at its top, in a comment
#     line starting "One concept over 400 lines:", why it is one concept
#     rather than two files.
#
#   bash tools/layer_rules.sh           checks all five; exit 1 naming each line at fault
#   bash tools/layer_rules.sh --tables  prints the tables of rules 1 and 2 as ARCHITECTURE.md shows them
#   bash tools/layer_rules.sh --folders prints the library folders, one a line
#                                       (tools/architecture.sh reads them)
#
# ctest's docs.layer_rules runs the check. The tables below are the rules;
# change them here, then run tools/architecture.sh, which copies them into
# ARCHITECTURE.md. Plain grep and awk under LC_ALL=C.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

# ---- rule 1: the kinds of public header ------------------------------------
# header  kind  folder that implements it ("-": none, header-only or umbrella)
headers='error.h foundation -
log.h foundation core
comm.h foundation comm
launch_info.h foundation comm
mesh.h type parallel
mesh_shape.h type parallel
tensor_parallel.h type parallel
sequence_parallel.h type parallel
pipeline.h type parallel
activation_checkpointing.h type activations
unit.h type partition
choices.h type config
data.h type data
config.h facade config
launch_config.h facade accelerate
engine.h facade engine
init.h facade engine
accelerate.h facade accelerate
llama.h facade llama
zero.h facade -'
# The library's folders below the engine (engine/ and accelerate/ are above).
below_engine='core comm offload partition activations parallel ckpt torchsave interop monitor profile data config'

# ---- rule 4: the library folders -------------------------------------------------
# Top-level folders that are not the library: programs, tests, benchmarks,
# build support, ready configs, and the public headers (rule 1's).
not_library='bench cmake configs examples include tests tools'
library_folders() {
  local d
  for d in */; do  # sorted: LC_ALL=C
    d=${d%/}
    case " $not_library " in *" $d "*) continue ;; esac
    case "$d" in build* | install* | runs) continue ;; esac  # .gitignore's build folders
    [ -f "$d/CMakeCache.txt" ] || echo "$d"
  done
}

# ---- rule 2: which errors each library folder throws --------------------------
# Each class names what is at fault, whichever file notices it:
errors_meaning="ConfigError the configuration: a ds_config, a launch config, or the options a program gives in their place
CommError another rank, the link between ranks, or the launch environment
PartitionError the model as partitioned: its parameters' shapes, units and splits
OffloadError offload's host memory, the CPU optimizer's inputs, the NVMe folder
CheckpointError a checkpoint's files, read or written
EngineError the program's calls at run time (their order and arguments) and what the engine writes as it trains (monitors)"
# folder  the classes it may throw (what it can meet); "none": it throws nothing
errors_allowed='core none
comm CommError
offload OffloadError
partition PartitionError OffloadError
activations EngineError
parallel ConfigError CommError PartitionError EngineError
ckpt CheckpointError
torchsave CheckpointError
interop CheckpointError
monitor EngineError
profile none
data EngineError
config ConfigError
optim ConfigError OffloadError EngineError
telemetry none
engine ConfigError OffloadError CheckpointError EngineError
accelerate ConfigError CheckpointError EngineError
llama ConfigError EngineError'

if [ "${1:-}" = --folders ]; then
  library_folders
  exit 0
fi
if [ "${1:-}" = --tables ]; then
  echo "| public header | kind | implemented in |"
  echo "|---|---|---|"
  while read -r h kind where; do
    case "$kind" in
      foundation) kind="foundation: any folder" ;;
      type) kind="public type: any folder" ;;
      facade) kind="façade: engine/, accelerate/ and programs" ;;
    esac
    echo "| \`zero/$h\` | $kind | $([ "$where" = - ] && echo "header only" || echo "\`$where/\`") |"
  done <<< "$headers"
  echo
  echo "| error | what is at fault |"
  echo "|---|---|"
  while read -r class meaning; do
    echo "| \`$class\` | $meaning |"
  done <<< "$errors_meaning"
  echo
  echo "| folder | throws |"
  echo "|---|---|"
  while read -r folder classes; do
    echo "| \`$folder/\` | $([ "$classes" = none ] && echo "nothing" || sed 's/\([A-Za-z]*\)/`\1`/g; s/` `/`, `/g' <<< "$classes") |"
  done <<< "$errors_allowed"
  exit 0
fi
[ $# -eq 0 ] || { echo "usage: bash tools/layer_rules.sh [--tables | --folders]" >&2; exit 2; }

faults=0
fault() { echo "$*" >&2; faults=$((faults + 1)); }

# ---- check rule 1 ----------------------------------------------------------------
kind_of() { awk -v h="$1" '$1 == h { print $2 }' <<< "$headers"; }
implementer_of() { awk -v h="$1" '$1 == h { print $3 }' <<< "$headers"; }
for h in include/zero/*.h; do
  [ -n "$(kind_of "${h#include/zero/}")" ] ||
    fault "$h: a public header of no kind; give it one in tools/layer_rules.sh (foundation, type or facade)"
done
# Lines `file:line:#include "zero/x.h"` of the given files.
public_includes() { grep -nHE '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]zero/[^">]+[">]' "$@" || true; }
for folder in $below_engine; do
  files=$(grep -rlE --include='*.h' --include='*.cpp' --include='*.cu' 'include' "$folder" || true)
  [ -n "$files" ] || continue
  while IFS= read -r hit; do
    header=$(sed -E 's/^[^"<]*#[[:space:]]*include[[:space:]]*["<]zero\/([^">]+)[">].*/\1/' <<< "${hit#*:*:}")
    kind=$(kind_of "$header")
    if [ "$kind" = facade ] && [ "$(implementer_of "$header")" != "$folder" ]; then
      fault "${hit%%:#*}: $folder/ is below the engine and includes the façade header zero/$header;" \
        "take what it needs from a foundation header or a public type, or pass it in from the engine"
    fi
  done <<< "$(public_includes $files)"
done
for h in include/zero/*.h; do
  kind=$(kind_of "${h#include/zero/}")
  [ "$kind" = foundation ] || [ "$kind" = type ] || continue
  while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    header=$(sed -E 's/^[^"<]*#[[:space:]]*include[[:space:]]*["<]zero\/([^">]+)[">].*/\1/' <<< "${hit#*:*:}")
    [ "$(kind_of "$header")" = facade ] &&
      fault "${hit%%:#*}: the $kind header ${h#include/} includes the façade header zero/$header, which every layer below the engine would then see"
  done <<< "$(public_includes "$h")"
done

# ---- check rule 2 ----------------------------------------------------------------
# A throw site: `throw X(` or `throw X{`, TORCH_CHECK (c10::Error), or an
# exception object built for later (std::make_exception_ptr). Comment lines
# are not code.
while read -r folder classes; do
  [ -d "$folder" ] || { echo "tools/layer_rules.sh: no folder $folder/; mend errors_allowed"; continue; }
  files=$(grep -rlE --include='*.h' --include='*.cpp' --include='*.cu' '(throw|TORCH_CHECK|make_exception_ptr)' "$folder" || true)
  [ -n "$files" ] || continue
  awk -v allowed=" $classes " '
    FNR == 1 { prev = "" }
    {
      text = $0; code = text; sub(/\/\/.*$/, "", code)
      word = "(^|[^A-Za-z_])"
      if (code ~ (word "(throw|TORCH_CHECK|make_exception_ptr)([^A-Za-z_]|$)") && code !~ (word "throw[ \t]*;")) {
        marked = (text ~ /not a zero::Error:/ || prev ~ /not a zero::Error:/)
        class = "?"
        if (match(code, word "throw[ \t]+(zero::)?[A-Za-z_:]+[ \t]*[({]")) {
          class = substr(code, RSTART, RLENGTH)
          sub(/^[^A-Za-z_]?throw[ \t]+(zero::)?/, "", class); sub(/[ \t]*[({]$/, "", class)
        } else if (code ~ /TORCH_CHECK/) class = "c10::Error"
        if (index(allowed, " " class " ") == 0 && !marked) {
          if (class == "?") why = "a throw whose class this check cannot read; write it as throw SomeError(...) on one line"
          else if (allowed == " none ") why = "throws " class ", but this folder throws nothing"
          else why = "throws " class ", not one of" allowed "(tools/layer_rules.sh, errors_allowed)"
          print FILENAME ":" FNR ": " why
        }
      }
      prev = text
    }' $files
done <<< "$errors_allowed" > "${TMPDIR:-/tmp}/layer_rules.$$"
while IFS= read -r f; do [ -n "$f" ] && fault "$f"; done < "${TMPDIR:-/tmp}/layer_rules.$$"
rm -f "${TMPDIR:-/tmp}/layer_rules.$$"

# ---- check rule 3 ----------------------------------------------------------------
# The sources of every object library but the precompiled header's, and of
# the torch-free tools.
torch_free_sources() {
  for cml in $(find . -name CMakeLists.txt -not -path './build*' -not -path './.venv/*' -not -path './tests/*'); do
    dir=$(dirname "${cml#./}")
    awk '/add_library\([A-Za-z_]+ OBJECT/ && !/zero_torch_pch/ { on = 1 }
         on { for (i = 1; i <= NF; i++) if ($i ~ /\.cpp\)?$/) { f = $i; sub(/\)$/, "", f); print f } }
         on && /\)/ { on = 0 }' "$cml" | sed "s|^|$dir/|"
  done
  ls tools/config/*.cpp tools/ckpt/*.cpp tools/launcher/*.cpp
}
declare -A seen=()
# Walks a file's quoted includes (include/, the root, then its own folder) and
# prints the first LibTorch include it reaches, with the chain that leads there.
torch_include_in() {  # file chain
  local file=$1 chain=$2 line inc next
  [ -z "${seen[$file]:-}" ] || return 1
  seen[$file]=1
  while IFS= read -r line; do
    inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]([^">]+)[">].*/\1/' <<< "$line")
    case "$inc" in
      torch/* | ATen/* | c10/*) echo "$chain -> <$inc>"; return 0 ;;
    esac
    for next in "include/$inc" "$inc" "$(dirname "$file")/$inc"; do
      if [ -f "$next" ]; then
        torch_include_in "$next" "$chain -> $next" && return 0
        break
      fi
    done
  done < <(grep -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]' "$file" || true)
  return 1
}
for src in $(torch_free_sources); do
  [ -f "$src" ] || { fault "$src: listed in a CMakeLists.txt but missing"; continue; }
  seen=()
  if chain=$(torch_include_in "$src" "$src"); then
    fault "$chain: $src builds without LibTorch (rule 3) but reaches a LibTorch header;" \
      "move what it needs into a torch-free header (as zero/mesh_shape.h holds Mesh's sizes)"
  fi
done

# ---- check rule 4 ----------------------------------------------------------------
# engine/'s headers are spelled "engine/x.h" from every folder (the root is
# on the include path), so one grep per folder finds them.
for folder in $(library_folders); do
  [ "$folder" = engine ] && continue
  while IFS= read -r hit; do
    [ -n "$hit" ] || continue
    fault "${hit%%:[[:space:]#]*}: $folder/ includes a header of engine/, the top of the library (rule 4);" \
      "move what both need into $folder/ or a folder below it, or pass it in from the engine"
  done <<< "$(grep -rnHE --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cc' --include='*.cu' \
                '^[[:space:]]*#[[:space:]]*include[[:space:]]*["<]engine/' "$folder" | sort || true)"
done

# ---- check rule 5 ----------------------------------------------------------------
for folder in $(library_folders); do
  while IFS= read -r file; do
    [ -n "$file" ] || continue
    [ "$(wc -l < "$file")" -gt 400 ] || continue
    head -n 30 "$file" | grep -q '^// One concept over 400 lines:' ||
      fault "$file: $(wc -l < "$file") lines, and no '// One concept over 400 lines: <why>' near its top (rule 5);" \
        "split it by concept, or say why it is one"
  done <<< "$(grep -rlE --include='*.h' --include='*.hpp' --include='*.cpp' --include='*.cc' --include='*.cu' '' "$folder" | sort || true)"
done

if [ "$faults" -gt 0 ]; then
  echo "tools/layer_rules.sh: $faults line(s) break the layer rules of ARCHITECTURE.md (above)" >&2
  exit 1
fi
