// What kernels/attention_prefill.cu needs on the host beyond ../mma-emu/shim.h: __syncwarp,
// make_float4, an f16 encoder standing in for the kv_store PTX, the dynamic shared memory of
// the prefill kernel, and a launcher over a 3-D grid (the shim's runs x and y only).
#include "../mma-emu/shim.h"

inline void __syncwarp(unsigned = 0xffffffffu) { warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

// f32 to f16 bits, truncating the mantissa (only the cache write of attn_prep uses it, which
// the harness does not run; the harness builds its f16 caches itself).
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

void launch3(Dim grid, int threads, const std::function<void()>& body) {
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = grid;
    for (unsigned bz = 0; bz < grid.z; ++bz)
        for (unsigned by = 0; by < grid.y; ++by)
            for (unsigned bx = 0; bx < grid.x; ++bx) {
                std::barrier<> cta(threads);
                cta_barrier = &cta;
                std::vector<std::unique_ptr<std::barrier<>>> warps;
                for (int w = 0; w < threads / 32; ++w) {
                    warps.emplace_back(new std::barrier<>(32));
                    warp_barriers[w] = warps.back().get();
                }
                std::vector<std::thread> ts;
                for (int t = 0; t < threads; ++t)
                    ts.emplace_back([&, t] {
                        threadIdx = {(unsigned)t, 0, 0};
                        blockIdx = {bx, by, bz};
                        body();
                    });
                for (auto& t : ts) t.join();
            }
}
