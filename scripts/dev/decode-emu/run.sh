#!/usr/bin/env bash
# Runs the decode kernels written without a GPU (the fused router, the device argmax and its
# ids, the small-batch q8 products, two rows a warp, attention splits of 8 warps and by depth,
# four rows a lane group in the expert gate/up, the routing's tree of picks, the expert down's
# CTA sizes and id groups, the norms' sum of squares, the MTP input's norms in one launch, the IQ2 sign masks) on
# the host: the modules' sources compiled as C++ with stand-ins for the CUDA built-ins
# (../emu-common/shim.h, emu.h), every CUDA thread a host thread. harness.cpp checks each against the launches it replaces, bit for
# bit (both sides compiled alike: a difference is a fault of layout, indexing or order), the
# attention against doubles. Needs g++ with C++20 and python3. An argument (router, argmax,
# small, rows, attention, moe, iq1m, signs, norm) runs that group only.
#
# EMU_DEFINES adds compiler flags (a compile option's define, e.g. -DATTN_WIDE_LOADS=0).
#
# Usage: [EMU_DEFINES=...] scripts/dev/decode-emu/run.sh [GROUP]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for module in elementwise moe matmul attention; do
  cargo run --release -q -p redlite-cuda --example dump_module -- "$module" "$work/$module.cu"
  python3 "$here/../emu-common/host_source.py" decode-emu "$work/$module.cu" \
    "$work/${module}_host.cu"
done
# The kernels as compiled for sm_90 with programmatic dependent launch (the shim's
# __CUDA_ARCH__ leaves the wait out; what runs before it is what the GPU runs before it).
g++ -std=c++20 -O1 -w -pthread -DREDLITE_PDL=1 ${EMU_DEFINES:-} -I"$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness" "$@"
