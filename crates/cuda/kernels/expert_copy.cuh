// The expert cache's copy of one chunk of an expert's bytes from page-locked host memory
// (read over PCIe) into its slot: expert_cache.cu's fill kernel and moe_cached.cu's copy
// CTAs. Needs common.cuh before it.

// Copies bytes [begin, min(begin + chunk, bytes)) of one expert's tensor from `src` to
// `dst` with the CTA's threads: 16-byte loads, four in flight per thread, when `wide`
// (PCIe reads of whole 128-byte lines), else bytes one at a time.
static __device__ __forceinline__ void copy_expert_chunk(const u8* __restrict__ src,
                                                         u8* __restrict__ dst, i64 bytes,
                                                         i64 begin, i64 chunk, int wide) {
    if (begin >= bytes) return;
    const i64 end = min(begin + chunk, bytes);
    if (wide) {
        const uint4* s = reinterpret_cast<const uint4*>(src + begin);
        uint4* d = reinterpret_cast<uint4*>(dst + begin);
        const i64 n = (end - begin) / 16;
        i64 i = threadIdx.x;
        for (; i + 3 * blockDim.x < n; i += 4 * blockDim.x) {
            const uint4 a = s[i], b = s[i + blockDim.x], c = s[i + 2 * blockDim.x],
                        e = s[i + 3 * blockDim.x];
            d[i] = a, d[i + blockDim.x] = b, d[i + 2 * blockDim.x] = c, d[i + 3 * blockDim.x] = e;
        }
        for (; i < n; i += blockDim.x) d[i] = s[i];
    } else {
        for (i64 i = begin + threadIdx.x; i < end; i += blockDim.x) dst[i] = src[i];
    }
}

// The GPU's global nanosecond clock (the expert cache's wait statistics).
static __device__ __forceinline__ u64 global_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
