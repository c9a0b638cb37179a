#!/usr/bin/env bash
# Runs the DeltaNet kernels (kernels/deltanet.cu, deltanet_chunked.cu, deltanet_replay.cu) on the
# host, without a GPU, through the emulators' stand-ins for the CUDA built-ins
# (../emu-common/shim.h; the few more these kernels use are in extra.h): every CUDA thread a
# host thread, barriers real barriers. harness.cpp checks that the token-parallel conv writes the
# same bits as the token-loop conv, and that the chunked delta rule matches the token-loop
# kernel within 1e-4 (L2 of the difference over L2 of the values) on outputs and final state,
# and that the replayed MTP rollback rebuilds each kept row's state bit for bit.
# It checks indexing and arithmetic, not speed. Needs g++ with C++20 and python3.
#
# Usage: scripts/dev/deltanet-emu/run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cargo run --release -q -p redlite-cuda --example dump_module -- deltanet "$work/module.cu"
python3 "$here/../emu-common/host_source.py" deltanet-emu "$work/module.cu" "$work/deltanet_host.cu"
g++ -std=c++20 -O2 -w -pthread -I"$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
