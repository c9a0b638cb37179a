#!/usr/bin/env bash
# Compiles every CUDA kernel with NVRTC for sm_80 and sm_90, on a machine with no GPU and
# no CUDA toolkit, and refuses q8 product kernels that use local memory (compile_kernels.rs).
# NVRTC comes from PyPI's nvidia-cuda-nvrtc wheel (CUDA 13.0, the version of the driver on
# the GPU machines), installed into a venv under .cache/ci-nvrtc/, and cudarc finds
# libnvrtc.so.13 through LD_LIBRARY_PATH.
#
# Usage: scripts/ci/nvrtc-check.sh [ARCH...]   (default: sm_80 sm_90)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

nvrtc_version="${NVRTC_VERSION:-13.0.88}"
venv=".cache/ci-nvrtc/venv"

installed() {
    "$venv/bin/python" - "$nvrtc_version" 2>/dev/null <<'PY'
import sys
from importlib.metadata import version
sys.exit(version("nvidia-cuda-nvrtc") != sys.argv[1])
PY
}

if ! installed; then
    echo "nvrtc-check: installing nvidia-cuda-nvrtc==$nvrtc_version into $venv"
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
        "nvidia-cuda-nvrtc==$nvrtc_version"
fi

lib_dir="$(find "$venv" -name 'libnvrtc.so.13' -printf '%h\n' | head -n 1)"
if [[ -z "$lib_dir" ]]; then
    echo "nvrtc-check: libnvrtc.so.13 not found under $venv" >&2
    exit 1
fi
# libnvrtc loads libnvrtc-builtins from the same folder through the loader path too.
export LD_LIBRARY_PATH="$PWD/$lib_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [[ $# -eq 0 ]]; then
    set -- sm_80 sm_90
fi
# Verbose: ptxas reports local memory, and a q8 product kernel using it fails the check.
REDLITE_NVRTC_VERBOSE=1 cargo run --release --locked -q -p redlite-cuda --example compile_kernels -- "$@"
