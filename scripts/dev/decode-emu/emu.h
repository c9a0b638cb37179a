// What the decode kernels of kernels/moe_route.cu, elementwise.cu, matmul.cu and attention.cu
// need on the host beyond ../emu-common/shim.h: the warp-wide integer reductions through the
// shim's per-warp exchange, the fence and the 64-bit atomic maximum of the "last CTA" and
// argmax kernels (CTAs run one at a time, so they only have to be correct, not fast),
// __ldcg, and the math the kernels call unqualified.
#include "../emu-common/shim.h"
#include <atomic>
#include <cmath>
#include <math.h>

using std::isfinite;

template <class T>
T __ldcg(const T* p) {
    return *p;
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    unsigned long long old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return old;
}

// Every lane of the warp gets `op` over the 32 lanes' values.
template <class Op>
unsigned warp_reduce_u32(unsigned v, Op op) {
    uint64_t all[32];
    warp_gather(v, all);
    unsigned r = (unsigned)all[0];
    for (int i = 1; i < 32; ++i) r = op(r, (unsigned)all[i]);
    return r;
}
inline unsigned __reduce_max_sync(unsigned, unsigned v) {
    return warp_reduce_u32(v, [](unsigned a, unsigned b) { return a > b ? a : b; });
}
inline unsigned __reduce_min_sync(unsigned, unsigned v) {
    return warp_reduce_u32(v, [](unsigned a, unsigned b) { return a < b ? a : b; });
}
