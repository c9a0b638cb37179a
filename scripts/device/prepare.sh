#!/usr/bin/env bash
# Here (no GPU needed): builds what scripts/device/run.sh runs on the GPU machine and copies it
# into .cache/device/ (ignored by git; name it in the device call's `carry`):
#   redlite          cargo build --release --features cuda
#   cuda_parity      the engine's CUDA parity tests (test binary)
#   kernels          the cuda crate's kernel tests (test binary)
#   llama-src.tgz    llama.cpp's sources from the pinned llama-cpp-python sdist (for llama-bench)
#
#   bash scripts/device/prepare.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.cache/device"
mkdir -p "$D"
cd "$ROOT"

cargo build --release --locked --features cuda -p redlite-cli
cp target/release/redlite "$D/redlite"

test_binary() {
  # The path cargo prints for a test target built with --no-run.
  cargo test --release --locked "$@" --no-run 2>&1 | sed -n 's/.*(\(target\/release\/deps\/[^)]*\)).*/\1/p' | tail -1
}
cp "$(test_binary --features cuda -p redlite-engine --test cuda_parity)" "$D/cuda_parity"
cp "$(test_binary -p redlite-cuda --test kernels)" "$D/kernels"

if [ ! -f "$D/llama-src.tgz" ]; then
  sdist="$ROOT/.cache/reference/dl/llama_cpp_python-0.3.36.tar.gz"
  [ -f "$sdist" ] || REF_WITH_TORCH=0 bash "$ROOT/scripts/reference/setup.sh"
  tmp="$(mktemp -d)"
  tar xzf "$sdist" -C "$tmp"
  tar czf "$D/llama-src.tgz" -C "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp .
  rm -rf "$tmp"
fi
du -sh "$D"/*
echo "carry .cache/device; on the GPU machine: bash scripts/device/run.sh"
