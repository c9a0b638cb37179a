// What kernels/attention_prefill.cu needs on the host beyond ../emu-common/shim.h: an f16
// encoder for the harness's f16 caches and the dynamic shared memory of the prefill kernel.
#include "../emu-common/shim.h"

// f32 to f16 bits, truncating the mantissa: how the harness builds its f16 caches (the kernels'
// own conversions go through the shim's emu_to_half, rounding to nearest even).
inline unsigned short emu_f16_bits(float value) {
    unsigned u = __float_as_uint(value), sign = (u >> 16) & 0x8000;
    int exp = (int)((u >> 23) & 255) - 127 + 15;
    if (exp <= 0) return (unsigned short)sign;
    if (exp >= 31) return (unsigned short)(sign | 0x7c00);
    return (unsigned short)(sign | (exp << 10) | ((u >> 13) & 1023));
}

// The largest prefill CTA (head dim 256): 64 q rows, 64 padded K rows, 64 V rows, 8 x 64 x 8
// probabilities.
float prefill_shared[64 * 256 + 64 * 260 + 64 * 256 + 8 * 64 * 8];
// The decode merge (attention_combine_kernel, compiled with the module, not run here).
float factor[1 << 12];
