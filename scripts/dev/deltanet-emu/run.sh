#!/usr/bin/env bash
# Runs the DeltaNet prompt kernels (kernels/deltanet.cu, kernels/deltanet_chunked.cu) on the
# host, without a GPU, through the mma emulator's stand-ins for the CUDA built-ins
# (../mma-emu/shim.h; the few more these kernels use are in extra.h): every CUDA thread a host
# thread, barriers real barriers. harness.cpp checks that the token-parallel conv writes the
# same bits as the token-loop conv, and that the chunked delta rule matches the token-loop
# kernel within 1e-4 (L2 of the difference over L2 of the values) on outputs and final state.
# It checks indexing and arithmetic, not speed. Needs g++ with C++20 and python3.
#
# Usage: scripts/dev/deltanet-emu/run.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here/../../.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cargo run -q -p redlite-cuda --example dump_module -- deltanet "$work/module.cu"
python3 - "$work/module.cu" "$work/deltanet_host.cu" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s = s.replace('asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));', 'value = emu_half(bits);')
s = s.replace('asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));', 'bits = emu_to_half(value);')
s = re.sub(r'__launch_bounds__\([^)]*\)', '', s)
s = s.replace('extern __shared__', 'extern')
if re.search(r'\basm\b', s):
    sys.exit("deltanet-emu: inline PTX left that the emulator does not know")
open(sys.argv[2], 'w').write(s)
PY
g++ -std=c++20 -O2 -w -pthread -I"$work" -I"$here/../mma-emu" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
