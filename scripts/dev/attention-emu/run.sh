#!/usr/bin/env bash
# Runs the flash prefill attention kernel (kernels/attention_prefill.cu) on the host, without
# a GPU, the way scripts/dev/mma-emu runs the tensor-core kernels: the attention module's
# source compiled as C++ with stand-ins for the CUDA built-ins (../emu-common/shim.h, emu.h),
# every CUDA thread a host thread. harness.cpp checks it (with and without KV splits, the
# splits merged by attention_combine_kernel) against a double-precision reference: relative
# L2 error per (token, head) row at most 1e-5. Needs g++ with C++20 and python3.
#
# Usage: scripts/dev/attention-emu/run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cargo run --release -q -p redlite-cuda --example dump_module -- attention "$work/module.cu"
python3 "$here/../emu-common/host_source.py" attention-emu "$work/module.cu" \
  "$work/attention_host.cu"
g++ -std=c++20 -O2 -w -pthread -I"$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
