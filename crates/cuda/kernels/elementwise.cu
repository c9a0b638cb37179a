// Embedding gather, RMSNorm over rows, residual add. Needs common.cuh, the tables,
// blocks.cuh, reduce.cuh and q8dot.cuh before it.

// x[t] = decode(table row tokens[t]); one CTA per token, threads walk the row's items.
// An id past the table gives zeros (the engine refuses such ids before launching).
template <class B>
__global__ void embed_kernel(const u8* __restrict__ table, const u32* __restrict__ tokens,
                             float* __restrict__ x, int rows, int cols) {
    pdl_begin();
    B::prepare();
    const int t = blockIdx.x;
    const int blocks_per_row = cols / B::VALUES;
    if (tokens[t] >= u32(rows)) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) x[i64(t) * cols + i] = 0.0f;
        return;
    }
    const u8* row = table + i64(tokens[t]) * blocks_per_row * B::BYTES;
    float* out = x + i64(t) * cols;
    const int items = blocks_per_row * B::ITEMS;
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        float* y = out + block * B::VALUES;
        B::decode(row + i64(block) * B::BYTES, item,
                  [&](int index, float value) { y[index] = value; });
    }
}

// Float4 chunks each thread keeps in registers in `norm_row` (rows up to 4 x this x
// blockDim values take the vector path).
#define NORM_CHUNKS 4

// block_reduce_sum of non-negative values (no -0) over a CTA of 8 warps, the same bits (host
// emulator case `norm`) with one barrier where it has two and a second butterfly (`norm_row`'s
// sum of squares, 97 norms a decode step): each warp's butterfly, one barrier, then every
// thread adds the 8 warp sums in the order the second butterfly does. Its lanes 8-31 add zeros
// at offsets 16 and 8 (x + 0 = x for x ≥ +0), then at offset 4 lane i holds s_i + s_(i+4), at 2
// those pairs' sums two apart, at 1 the last two: ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 +
// s7)), addition commuting bit for bit. One call a kernel (`scratch` is not guarded against a
// second).
static __device__ __forceinline__ float block_sum_of_8_warps(float value, float* scratch) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    value = warp_reduce_sum(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    float s[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) s[w] = scratch[w];
#pragma unroll
    for (int half = 4; half >= 1; half /= 2) {
#pragma unroll
        for (int i = 0; i < half; ++i) s[i] += s[i + half];
    }
    return s[0];
}

// One row of RMSNorm, with the residual add first when `y` is not null (then `x` is
// updated in place): v = x (+ y); out = v * w / sqrt(mean(v^2) + eps). Rows whose length
// is a multiple of 4 with 16-byte aligned pointers are read as float4 chunks kept in
// registers, w loaded before the reduction (the kernel is a chain of dependent memory
// round trips); thread i sums the squares of its chunks i, i + blockDim, ... in order.
// Both norm kernels call this, so the fused add + norm gives the bits of add then norm. It
// makes the kernel's `pdl_begin` (every caller's first global access is here).
static __device__ __forceinline__ void norm_row(float* x, const float* y, const float* w,
                                                float* out, int cols, float eps,
                                                float* stage = nullptr) {
    __shared__ float scratch[32];
    const u64 addresses = reinterpret_cast<u64>(x) | reinterpret_cast<u64>(w) |
                          reinterpret_cast<u64>(out) | reinterpret_cast<u64>(y);
    const int chunks = cols / 4;
    // Under PDL w (a weight) is loaded before the wait, while the previous kernel still runs.
    constexpr bool EARLY_W = REDLITE_PDL != 0;
    if ((cols & 3) == 0 && (addresses & 15) == 0 && chunks <= NORM_CHUNKS * int(blockDim.x)) {
        float4 v[NORM_CHUNKS], wv[NORM_CHUNKS];
        if (EARLY_W) {
#pragma unroll
            for (int c = 0; c < NORM_CHUNKS; ++c) {
                const int i = threadIdx.x + c * blockDim.x;
                if (i < chunks) wv[c] = reinterpret_cast<const float4*>(w)[i];
            }
        }
        pdl_begin();
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < NORM_CHUNKS; ++c) {
            const int i = threadIdx.x + c * blockDim.x;
            if (i < chunks) {
                if (!EARLY_W) wv[c] = reinterpret_cast<const float4*>(w)[i];
                v[c] = reinterpret_cast<const float4*>(x)[i];
                if (y != nullptr) {
                    const float4 a = reinterpret_cast<const float4*>(y)[i];
                    v[c] = make_float4(v[c].x + a.x, v[c].y + a.y, v[c].z + a.z, v[c].w + a.w);
                    reinterpret_cast<float4*>(x)[i] = v[c];
                }
                ss += v[c].x * v[c].x;
                ss += v[c].y * v[c].y;
                ss += v[c].z * v[c].z;
                ss += v[c].w * v[c].w;
            }
        }
        ss = blockDim.x == 8 * WARP_SIZE ? block_sum_of_8_warps(ss, scratch)
                                         : block_reduce_sum(ss, scratch);
        const float scale = 1.0f / sqrtf(ss / float(cols) + eps);
#pragma unroll
        for (int c = 0; c < NORM_CHUNKS; ++c) {
            const int i = threadIdx.x + c * blockDim.x;
            if (i < chunks) {
                const float4 o = make_float4(v[c].x * scale * wv[c].x, v[c].y * scale * wv[c].y,
                                             v[c].z * scale * wv[c].z, v[c].w * scale * wv[c].w);
                reinterpret_cast<float4*>(out)[i] = o;
                if (stage != nullptr) reinterpret_cast<float4*>(stage)[i] = o;
            }
        }
        return;
    }
    pdl_begin();
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = y != nullptr ? x[i] + y[i] : x[i];
        if (y != nullptr) x[i] = v;
        ss += v * v;
    }
    ss = block_reduce_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / float(cols) + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float o = x[i] * scale * w[i];
        out[i] = o;
        if (stage != nullptr) stage[i] = o;
    }
}

// out[r] = x[r] * w / sqrt(mean(x[r]^2) + eps); one CTA per row (in place is allowed: each
// thread reads its values before writing them).
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float* out,
                                int cols, float eps) {
    norm_row(const_cast<float*>(x) + i64(blockIdx.x) * cols, nullptr, w,
             out + i64(blockIdx.x) * cols, cols, eps);
}

// The MTP block's input halves side by side (spec §4.2), one launch for both norms: CTA
// r < rows norms embedding row r by enorm into concat[r][0, cols), CTA rows + r hidden row r
// by hnorm into concat[r][cols, 2 cols). Each row rms_norm_kernel's bits (`norm_row`), without
// the two norms' own buffers and a copy of each half a row.
__global__ void mtp_concat_norms_kernel(const float* __restrict__ embedded,
                                        const float* __restrict__ hidden,
                                        const float* __restrict__ enorm,
                                        const float* __restrict__ hnorm,
                                        float* __restrict__ concat, int rows, int cols,
                                        float eps) {
    const bool second = int(blockIdx.x) >= rows;
    const int r = second ? int(blockIdx.x) - rows : int(blockIdx.x);
    const float* x = (second ? hidden : embedded) + i64(r) * cols;
    norm_row(const_cast<float*>(x), nullptr, second ? hnorm : enorm,
             concat + i64(r) * 2 * cols + (second ? cols : 0), cols, eps);
}

// x += y over n values.
__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int n) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x[r] += y[r], then out[r] = x[r] * w / sqrt(mean(x[r]^2) + eps): add_kernel then
// rms_norm_kernel in one launch (one CTA per row), the same bits (`norm_row`). out must
// not alias x or y.
__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ y,
                                    const float* __restrict__ w, float* __restrict__ out,
                                    int cols, float eps) {
    norm_row(x + i64(blockIdx.x) * cols, y + i64(blockIdx.x) * cols, w,
             out + i64(blockIdx.x) * cols, cols, eps);
}

// The two norms above, each row's output also quantized to Q8_K into global memory (`d`:
// cols / 256 scales per row, `q`: cols codes per row; cols a multiple of 256) for the q8
// products that read it (`matmul_q8_kernel` and the others taking `gd`, `gq`): their CTAs
// then skip quantizing it each. The codes are `quantize_q8k_shared`'s for the same values,
// so every product gets the bits it would quantize itself. Dynamic shared memory: cols * 4
// bytes (the row's output, staged for the quantization). Both kernels are `norm_row_q8`.
static __device__ __forceinline__ void norm_row_q8(float* x, const float* y, const float* w,
                                                   float* out, float* d, i8* q, int cols,
                                                   float eps) {
    extern __shared__ float4 norm_stage[];
    float* stage = reinterpret_cast<float*>(norm_stage);
    const i64 row = blockIdx.x;
    norm_row(x + row * cols, y != nullptr ? y + row * cols : nullptr, w, out + row * cols, cols,
             eps, stage);
    __syncthreads();
    const int blocks = cols / Q8K_VALUES;
    quantize_q8k_blocks([=](int b) { return stage + b * Q8K_VALUES; }, blocks, d + row * blocks,
                        q + row * cols);
}

__global__ void rms_norm_q8_kernel(const float* x, const float* __restrict__ w, float* out,
                                   float* __restrict__ d, i8* __restrict__ q, int cols,
                                   float eps) {
    norm_row_q8(const_cast<float*>(x), nullptr, w, out, d, q, cols, eps);
}

__global__ void add_rms_norm_q8_kernel(float* __restrict__ x, const float* __restrict__ y,
                                       const float* __restrict__ w, float* __restrict__ out,
                                       float* __restrict__ d, i8* __restrict__ q, int cols,
                                       float eps) {
    PROBE_RETURN(PROBE_NORM);
    norm_row_q8(x, y, w, out, d, q, cols, eps);
}

// Greedy sampling on the device: the largest finite x[i] of x[0..n), ties to the lower i
// (-0 and +0 equal), NaN and infinities never chosen (the host's `greedy_argmax`). Each
// candidate is the key order(x[i]) << 32 | (2^32 - 1 - i), so one unsigned maximum picks the
// value and, among equal values, the lower index; `best` (zeroed before the launch) ends as
// the largest key, 0 where no value is finite. Grid (ceil(n / (blockDim x ARGMAX_PER_THREAD)),
// rows): row r of x (n values from x + r n) into best[r]; blockDim a multiple of 32; one
// atomicMax a CTA. ARGMAX_PER_THREAD is also in source.rs.
#define ARGMAX_PER_THREAD 8
__global__ void argmax_kernel(const float* __restrict__ x, int n, u64* __restrict__ best) {
    pdl_begin();
    x += i64(blockIdx.y) * n;
    best += blockIdx.y;
    __shared__ u64 warp_best[32];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int base = blockIdx.x * blockDim.x * ARGMAX_PER_THREAD + threadIdx.x;
    u64 key = 0;
#pragma unroll
    for (int k = 0; k < ARGMAX_PER_THREAD; ++k) {
        const int i = base + k * blockDim.x;
        if (i < n && isfinite(x[i])) {
            // -0 as +0: the host compares values, to which they are equal.
            const float v = x[i] == 0.0f ? 0.0f : x[i];
            const u64 candidate = (u64(float_order_key(v)) << 32) | u64(0xffffffffu - u32(i));
            key = candidate > key ? candidate : key;
        }
    }
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const u64 other = __shfl_xor_sync(0xffffffffu, key, offset);
        key = other > key ? other : key;
    }
    if (lane == 0) warp_best[warp] = key;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x / WARP_SIZE); ++w) {
            key = warp_best[w] > key ? warp_best[w] : key;
        }
        if (key != 0) atomicMax(best, key);
    }
}

// Chained greedy steps: the token each argmax key names (2^32 - 1 - its low half), as the
// ids a following embedding reads without the host seeing them; 0 where the key is 0 (no
// finite logit: the host reports that when it reads the keys, the embedding of token 0 in
// the meantime reads nothing out of bounds). One thread a key.
__global__ void ids_of_keys_kernel(const u64* __restrict__ keys, int n, u32* __restrict__ ids) {
    pdl_begin();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) ids[i] = keys[i] == 0 ? 0u : ~u32(keys[i]);
}

// Copies of whole float spans in one launch (an MTP rollback: every DeltaNet layer's conv
// window and recurrent state back from the row a verification recorded, 72 spans, instead
// of a copy launch each). spans[3 s .. 3 s + 3]: source address, destination address and
// floats of span s (grid.y); the CTAs of a column stride over it, four floats at a time
// where both ends are 16-byte aligned and the length a multiple of 4.
__global__ void copy_spans_kernel(const u64* __restrict__ spans) {
    pdl_begin();
    const u64* span = spans + 3 * blockIdx.y;
    const float* src = reinterpret_cast<const float*>(span[0]);
    float* dst = reinterpret_cast<float*>(span[1]);
    const u64 len = span[2];
    const u64 stride = u64(gridDim.x) * blockDim.x;
    const u64 first = u64(blockIdx.x) * blockDim.x + threadIdx.x;
    if (((span[0] | span[1]) & 15) == 0 && len % 4 == 0) {
        const float4* s4 = reinterpret_cast<const float4*>(src);
        float4* d4 = reinterpret_cast<float4*>(dst);
        for (u64 i = first; i < len / 4; i += stride) d4[i] = s4[i];
    } else {
        for (u64 i = first; i < len; i += stride) dst[i] = src[i];
    }
}
