#!/usr/bin/env bash
# Here (no GPU needed): builds what scripts/device/run.sh runs on the GPU machine and copies it
# into .cache/device/ (ignored by git; name it in the device call's `carry`):
#   redlite.xz       cargo build --release --features cuda, stripped and compressed
#   cuda_parity      the engine's CUDA parity tests (test binary)
#   cuda_mtp         the engine's MTP GPU tests (test binary)
#   cuda_serve       the serving scheduler on the GPU, batched against alone (test binary)
#   cuda_expert_cache  the expert cache's GPU tests (test binary)
#   kernels, routing, greedy, mma, attention, deltanet, preload, q8_input  the cuda crate's GPU tests
#                    (test binaries)
#   attention        the flash prefill attention against the per-token kernels (test binary)
#   llama-src.tgz    llama.cpp's sources from the pinned llama-cpp-python sdist (for llama-bench
#                    and llama-speculative-simple)
#
#   bash scripts/device/prepare.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
D="$ROOT/.cache/device"
mkdir -p "$D"
cd "$ROOT"

cargo build --release --locked --features cuda -p redlite-cli
# Stripped and compressed (15 MB, not 29), so that it and the llama.cpp sources fit one call's
# carry (64 MiB); the unstripped build stays in target/release.
rm -f "$D/redlite"
strip -o "$D/redlite.stripped" target/release/redlite
xz -T2 -6 -c "$D/redlite.stripped" > "$D/redlite.xz" && rm "$D/redlite.stripped"

test_binary() {
  # The path cargo prints for a test target built with --no-run.
  cargo test --release --locked "$@" --no-run 2>&1 | sed -n 's/.*(\(target\/release\/deps\/[^)]*\)).*/\1/p' | tail -1
}
cp "$(test_binary --features cuda -p redlite-engine --test cuda_parity)" "$D/cuda_parity"
cp "$(test_binary --features cuda -p redlite-engine --test cuda_mtp)" "$D/cuda_mtp"
cp "$(test_binary --features cuda -p redlite-engine --test cuda_serve)" "$D/cuda_serve"
cp "$(test_binary --features cuda -p redlite-engine --test cuda_expert_cache)" "$D/cuda_expert_cache"
cp "$(test_binary -p redlite-cuda --test kernels)" "$D/kernels"
cp "$(test_binary -p redlite-cuda --test routing)" "$D/routing"
cp "$(test_binary -p redlite-cuda --test greedy)" "$D/greedy"
cp "$(test_binary -p redlite-cuda --test mma)" "$D/mma"
cp "$(test_binary -p redlite-cuda --test attention)" "$D/attention"
cp "$(test_binary -p redlite-cuda --test deltanet)" "$D/deltanet"
cp "$(test_binary -p redlite-cuda --test preload)" "$D/preload"
cp "$(test_binary -p redlite-cuda --test q8_input)" "$D/q8_input"
# Stripped (~20 % smaller), so that two builds and a few test binaries fit one call's carry.
for t in cuda_parity cuda_mtp cuda_serve cuda_expert_cache kernels routing greedy mma attention \
    deltanet preload q8_input; do
  strip "$D/$t"
done

if [ ! -f "$D/llama-src.tgz" ]; then
  sdist="$ROOT/.cache/reference/dl/llama_cpp_python-0.3.36.tar.gz"
  [ -f "$sdist" ] || REF_WITH_TORCH=0 bash "$ROOT/scripts/reference/setup.sh"
  tmp="$(mktemp -d)"
  tar xzf "$sdist" -C "$tmp"
  # Only what the CUDA builds of llama-bench and llama-speculative-simple (its `draft-mtp`, for
  # issue 9's peer figure) read: no docs, vocab files, tests, web UI, other examples or other
  # GPU backends, so it fits a call's carry with redlite.
  skip=(docs models tools/ui tools/server tools/mtmd tests benches conversion scripts)
  for e in "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp/examples/*; do
    [ "$(basename "$e")" = speculative-simple ] || skip+=("examples/$(basename "$e")")
  done
  for b in et metal hexagon sycl vulkan opencl cann webgpu zdnn openvino virtgpu zendnn musa; do
    skip+=("ggml/src/ggml-$b")
  done
  tar czf "$D/llama-src.tgz" "${skip[@]/#/--exclude=./}" -C "$tmp"/llama_cpp_python-0.3.36/vendor/llama.cpp .
  rm -rf "$tmp"
fi
du -sh "$D"/*
# A call carries the tracked tree (~22 MB) and its carry paths in 64 MiB: everything above is
# ~53 MB, so move the test binaries the call does not run out of .cache/device and carry the
# folder, or name at most 8 of its files.
echo "carry .cache/device (less what the call does not run); on the GPU machine: bash scripts/device/run.sh"
