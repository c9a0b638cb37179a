#!/usr/bin/env bash
# Runs the flash prefill attention kernel (kernels/attention_prefill.cu) on the host, without
# a GPU, the way scripts/dev/mma-emu runs the tensor-core kernels: the attention module's
# source compiled as C++ with stand-ins for the CUDA built-ins (../mma-emu/shim.h, emu.h),
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
cargo run -q -p redlite-cuda --example dump_module -- attention "$work/module.cu"
python3 - "$work/module.cu" "$work/attention_host.cu" <<'PY'
import re, sys
s = open(sys.argv[1]).read()
s = s.replace('asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));', 'value = emu_half(bits);')
s = s.replace('asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));', 'bits = emu_f16_bits(value);')
s = re.sub(r'__launch_bounds__\([^)]*\)', '', s)
s = s.replace('extern __shared__', 'extern')
if re.search(r'\basm\b', s):
    sys.exit("attention-emu: inline PTX left that the emulator does not know")
open(sys.argv[2], 'w').write(s)
PY
g++ -std=c++20 -O2 -w -pthread -I"$work" "$here/harness.cpp" -o "$work/harness"
"$work/harness"
