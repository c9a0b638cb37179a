// Host stand-ins for the CUDA built-ins the kernel modules use, so that a module's source
// compiles as C++ for the emulators (scripts/dev/*-emu, after emu-common/host_source.py):
// built-in variables per host thread, __syncthreads and __syncwarp as barriers of the CTA's
// or the warp's threads, warp shuffles, ballots and mma.sync through per-warp exchange
// buffers (the fragment layouts of the PTX ISA for m16n8k32 / m16n8k16 with s8 inputs), and a
// launcher that runs a grid one CTA at a time with one host thread per CUDA thread.
#include <cstdint>
#include <cstring>
#include <cmath>
#include <barrier>
#include <thread>
#include <vector>
#include <functional>
#include <cstdio>
#include <cstdlib>
#define __device__
#define __forceinline__ inline
#define __global__
#define __host__
// Block-scope __shared__ variables become statics: one copy for all the threads of the CTA
// (CTAs run one at a time); run.sh turns `extern __shared__` into plain `extern`.
#define __shared__ static
#define __launch_bounds__(x)
#define __restrict__
#define __align__(n) __attribute__((aligned(n)))
#define __CUDA_ARCH__ 800
#define REDLITE_SHARED_TABLES 0
#define REDLITE_Q8_SHARED_TABLES 0
#define INFINITY (__builtin_inff())
struct uint4 { unsigned x, y, z, w; };
struct int4 { int x, y, z, w; };
struct uint2 { unsigned x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct uint3 { unsigned x, y, z; };
// blockIdx and friends; a kernel may pass blockIdx on as a uint3.
struct Dim {
    unsigned x = 0, y = 0, z = 0;
    operator uint3() const { return {x, y, z}; }
};
thread_local Dim threadIdx, blockIdx;
Dim blockDim, gridDim;
float emu_half(unsigned short h) {
    unsigned sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
    float v;
    if (exp == 0) v = std::ldexp((float)mant, -24);
    else if (exp == 31) v = mant ? NAN : INFINITY;
    else v = std::ldexp((float)(mant | 1024), (int)exp - 25);
    return sign ? -v : v;
}
// f32 to f16 bits, round to nearest even (cvt.rn.f16.f32).
inline unsigned short emu_to_half(float f) {
    _Float16 h = (_Float16)f;
    unsigned short bits;
    memcpy(&bits, &h, 2);
    return bits;
}
inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __vsub4(unsigned a, unsigned b) {
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((((a >> (8 * i)) & 255) - ((b >> (8 * i)) & 255)) & 255) << (8 * i);
    return r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    uint8_t bytes[8];
    for (int i = 0; i < 4; ++i) bytes[i] = x >> (8 * i), bytes[4 + i] = y >> (8 * i);
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)bytes[(s >> (4 * i)) & 7] << (8 * i);
    return r;
}
// PRMT with selector 0xBA98 and 0 as its second source: byte j of x's top bit over byte j.
inline unsigned emu_prmt_signs(unsigned x) {
    unsigned r = 0;
    for (int j = 0; j < 4; ++j) r |= ((x >> (8 * j + 7)) & 1u) * (0xffu << (8 * j));
    return r;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline void __trap() { abort(); }
std::barrier<>* cta_barrier;
std::barrier<>* warp_barriers[32];
inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline void __syncthreads() { cta_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { warp_barriers[threadIdx.x / 32]->arrive_and_wait(); }
// Warp exchange buffers.
uint64_t warp_buf[32][32][8];
// Lane `src` of the warp's values of `v` (`v` itself where `keep`).
template <class T>
T warp_exchange(T v, int src, bool keep = false) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    memcpy(&warp_buf[w][l][0], &v, sizeof(T));
    warp_barriers[w]->arrive_and_wait();
    T o = v;
    if (!keep) memcpy(&o, &warp_buf[w][src][0], sizeof(T));
    warp_barriers[w]->arrive_and_wait();
    return o;
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int off) {
    return warp_exchange(v, (threadIdx.x % 32) ^ off);
}
template <class T>
T __shfl_up_sync(unsigned, T v, int off) {
    const int l = threadIdx.x % 32;
    return warp_exchange(v, l - off, l < off);
}
template <class T>
T __shfl_sync(unsigned, T v, int src) {
    return warp_exchange(v, src);
}
// Every lane's `v` in lane order, into `all`.
inline void warp_gather(uint64_t v, uint64_t (&all)[32]) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    warp_buf[w][l][0] = v;
    warp_barriers[w]->arrive_and_wait();
    for (int i = 0; i < 32; ++i) all[i] = warp_buf[w][i][0];
    warp_barriers[w]->arrive_and_wait();
}
inline unsigned __ballot_sync(unsigned, bool predicate) {
    uint64_t all[32];
    warp_gather(predicate, all);
    unsigned mask = 0;
    for (int i = 0; i < 32; ++i) mask |= (all[i] != 0 ? 1u : 0u) << i;
    return mask;
}
inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline float sigmoidf_(float x) { return 1.0f / (1.0f + std::exp(-x)); }
void emu_mma(int (&c)[4], const unsigned* a, int na, const unsigned* b, int nb, int k) {
    int w = threadIdx.x / 32, l = threadIdx.x % 32;
    for (int i = 0; i < na; ++i) warp_buf[w][l][i] = a[i];
    for (int i = 0; i < nb; ++i) warp_buf[w][l][4 + i] = b[i];
    warp_barriers[w]->arrive_and_wait();
    int A[16][32] = {}, B[32][8] = {};
    for (int lane = 0; lane < 32; ++lane) {
        int g = lane >> 2, t = lane & 3;
        for (int i = 0; i < 4; ++i) {
            auto byte = [&](int reg) { return (int)(int8_t)(warp_buf[w][lane][reg] >> (8 * i)); };
            A[g][4 * t + i] = byte(0);
            A[g + 8][4 * t + i] = byte(1);
            B[4 * t + i][g] = byte(4);
            if (k == 32) {
                A[g][16 + 4 * t + i] = byte(2);
                A[g + 8][16 + 4 * t + i] = byte(3);
                B[16 + 4 * t + i][g] = byte(5);
            }
        }
    }
    warp_barriers[w]->arrive_and_wait();
    int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
        int r = g + 8 * (i >> 1), n = 2 * t + (i & 1);
        for (int kk = 0; kk < k; ++kk) c[i] += A[r][kk] * B[kk][n];
    }
}
inline void emu_mma_k32(int (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    unsigned b[2] = {b0, b1};
    emu_mma(c, a, 4, b, 2, 32);
}
inline void emu_mma_k16(int (&c)[4], unsigned a0, unsigned a1, unsigned b0) {
    unsigned a[2] = {a0, a1}, b[1] = {b0};
    emu_mma(c, a, 2, b, 1, 16);
}
float4 mma_shared[1 << 15];
int group_shared[3 * 4096];
// Runs the grid (z = 0 counts as 1) one CTA at a time, a host thread per CUDA thread.
void launch(Dim grid, int threads, const std::function<void()>& body) {
    blockDim = {(unsigned)threads, 1, 1};
    gridDim = {grid.x, grid.y, grid.z > 0 ? grid.z : 1};
    for (unsigned bz = 0; bz < gridDim.z; ++bz)
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
