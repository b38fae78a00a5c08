# Sourced by bundle.sh, rehearse.sh and run_all.sh with $python set: where
# that Python's torch keeps LibTorch, CUDA's runtime and NCCL, as the lease
# resolves them. Sets site (its site-packages) and torch_path (torch/lib, then
# every nvidia/*/lib, colon-separated).
torch_lib=$("$python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
site=$(dirname "$(dirname "$torch_lib")")
torch_path="$torch_lib$(find "$site/nvidia" -maxdepth 3 -type d -name lib -printf ':%p' 2>/dev/null)"
