#!/usr/bin/env bash
# Runs the int8 tensor-core kernels (kernels/mma.cu) on the host, without a GPU: the module's
# source is compiled as C++ with stand-ins for the CUDA built-ins (../emu-common/shim.h),
# every CUDA thread a host thread, barriers real barriers, and mma.sync emulated per warp from
# the PTX fragment layouts. harness.cpp checks the dense, gate/up and down + combine products of every covered
# block type against the q8 kernels' integer dots (Q8Dot), 1e-5 of each token's largest value.
# It checks layouts and arithmetic, not speed. Needs g++ with C++20 and python3.
#
# Usage: scripts/dev/mma-emu/run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cargo run --release -q -p redlite-cuda --example dump_module -- mma "$work/module.cu"
python3 "$here/../emu-common/host_source.py" mma-emu "$work/module.cu" "$work/mma_host.cu"
g++ -std=c++20 -O1 -w -pthread -I"$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
