#!/usr/bin/env python3
"""Turns a kernel module's NVRTC source (`dump_module`) into C++ for the host emulators
(scripts/dev/*-emu): the inline PTX they know becomes calls into their shims (f16
conversions, mma.sync, the byte permute that spreads sign bits), the PTX that only
schedules (L2 prefetch, programmatic dependent launch) goes, the timeline option's clock
reads 0, a volatile shared load becomes a plain one, a fresh read of a thread or block index
the built-in, launch bounds go and dynamic shared memory becomes plain extern arrays that
each harness defines. Any other inline PTX (outside comments) is refused: the emulator
would not know it.

Usage: host_source.py EMULATOR IN.cu OUT.cu
"""
import re
import sys

name, source_path, out_path = sys.argv[1:4]
s = open(source_path).read()
s = s.replace('asm("cvt.f32.f16 %0, %1;" : "=f"(value) : "h"(bits));', "value = emu_half(bits);")
s = s.replace('asm("cvt.rn.f16.f32 %0, %1;" : "=h"(bits) : "f"(value));', "bits = emu_to_half(value);")
s = re.sub(r'asm volatile\("prefetch\.global\.L2 \[%0\];" ::"l"\((.*?)\)\);', r"(void)(\1);", s)
s = re.sub(
    r'asm volatile\("ld\.(?:volatile\.)?shared\.v4\.f32 \{%0, %1, %2, %3\}, \[%4\];".*?\);',
    "v = *reinterpret_cast<const float4*>(p); (void)address;",
    s,
    flags=re.S,
)
s = re.sub(
    r'asm volatile\("mov\.u32 %0, %%(tid|ctaid)\.([xyz]);" : "=r"\((\w+)\)\);',
    lambda m: f"{m.group(3)} = {'threadIdx' if m.group(1) == 'tid' else 'blockIdx'}.{m.group(2)};",
    s,
)
s = re.sub(
    r'asm\("prmt\.b32 %0, %1, 0, 0xBA98;" : "=r"\((\w+)\) : "r"\((.*?)\)\);',
    r"\1 = emu_prmt_signs(\2);",
    s,
)
s = re.sub(r'asm volatile\("griddepcontrol\.[a-z_]+;" ::: "memory"\);', "", s)
s = s.replace('asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));', "t = 0;")
s = re.sub(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k32.*?\);', "emu_mma_k32(c, a, b0, b1);", s, flags=re.S)
s = re.sub(r'asm volatile\(\s*"mma\.sync\.aligned\.m16n8k16.*?\);', "emu_mma_k16(c, a0, a1, b0);", s, flags=re.S)
s = re.sub(r"__launch_bounds__\((?:[^()]|\([^()]*\))*\)", "", s)
s = s.replace("extern __shared__", "extern")
if re.search(r"\basm\b", re.sub(r"//.*", "", s)):
    sys.exit(f"{name}: inline PTX left that the emulator does not know")
open(out_path, "w").write(s)
