# Sourced by the bench scripts that run the PyTorch peers (bench/ddp_peer.py).
#
#   peer_python BUILD   sets `python`: $PYTHON when set, else the interpreter
#                       BUILD was configured with (ZERO_TORCH_PYTHON in its
#                       CMakeCache.txt, the PyPI wheel's .venv), else Debian's
#                       /usr/bin/python3 (python3-torch). The peers then run
#                       the same torch, and so the same BLAS (MKL in the
#                       wheel, OpenBLAS in Debian's), as the zero binary.
#   peer_check          sets `peers` (1: $python imports torch.distributed;
#                       installs python3-torch for Debian's python when root)
#                       and `fsdp2` (1: its torch has fully_shard), with one
#                       line on stderr for each row left out.
#   peer_require SCRIPT MODULE...
#                       exits 1 naming SCRIPT, $python and the first import
#                       error unless $python imports every MODULE (on CPU
#                       ranks: DS_ACCELERATOR=cpu for deepspeed).

peer_python() {
  local cache="$1/CMakeCache.txt" configured=""
  [ -f "$cache" ] && configured=$(sed -n 's/^ZERO_TORCH_PYTHON:[A-Z]*=//p' "$cache" | head -n 1)
  python="${PYTHON:-${configured:-/usr/bin/python3}}"
}

peer_check() {
  peers=1 fsdp2=0
  if ! "$python" -c 'import torch.distributed' 2>/dev/null; then
    # Only Debian's python gets its torch from apt; a venv's comes from pip.
    if [ "$python" = /usr/bin/python3 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch >/dev/null || true
    fi
    "$python" -c 'import torch.distributed' 2>/dev/null || {
      peers=0
      echo "note: $python cannot import torch: the PyTorch rows are left out (apt-get install python3-torch, or PYTHON=...)" >&2
      return 0
    }
  fi
  # ddp_peer.py says in one line why it cannot run FSDP2 (torch < 2.6).
  "$python" "$(dirname "${BASH_SOURCE[0]}")/ddp_peer.py" --mode fsdp2 --check && fsdp2=1 || true
}

peer_require() {
  local script="$1" why
  shift
  if ! why="$("$python" -c "import importlib, os, sys; os.environ['DS_ACCELERATOR'] = 'cpu'
for m in sys.argv[1:]: importlib.import_module(m)" "$@" 2>&1)"; then
    echo "$script: $python cannot import $* (${why##*$'\n'}); run ZERO_TORCH=wheel bash tools/setup-deps.sh, or set PYTHON" >&2
    exit 1
  fi
}
