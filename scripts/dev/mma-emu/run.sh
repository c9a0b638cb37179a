#!/usr/bin/env bash
# Runs the int8 tensor-core kernels (kernels/mma.cu) on the host, without a GPU: the module's
# source is compiled as C++ with stand-ins for the CUDA built-ins (shim.h), every CUDA thread
# a host thread, barriers real barriers, and mma.sync emulated per warp from the PTX fragment
# layouts. harness.cpp checks the dense, gate/up and down + combine products of every covered
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
python3 - "$work/module.cu" "$work/mma_host.cu" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s = s.replace('asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));', 'value = emu_half(bits);')
s = s.replace('asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));', 'bits = emu_to_half(value);')
s = re.sub(r'asm volatile\("prefetch\.global\.L2 \[%0\];" ::"l"\(p \+ at\)\);', '(void)p;', s)
s = re.sub(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k32.*?\);', 'emu_mma_k32(c, a, b0, b1);', s, flags=re.S)
s = re.sub(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k16.*?\);', 'emu_mma_k16(c, a0, a1, b0);', s, flags=re.S)
s = re.sub(r'__launch_bounds__\([^)]*\)', '', s)
s = s.replace('extern __shared__', 'extern')
if re.search(r'\basm\b', s):
    sys.exit("mma-emu: inline PTX left that the emulator does not know")
open(sys.argv[2], 'w').write(s)
PY
g++ -std=c++20 -O1 -w -pthread -I"$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
