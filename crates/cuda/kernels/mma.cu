// Int8 tensor-core products for prompt ingestion (several tokens): Y = W · X with W in its
// GGUF blocks and X quantized to Q8_K (mma_quantize_kernel, the same codes and scales as the
// q8 kernels and the CPU). Per CTA: MT weight rows x NT tokens (or expert pairs); per 256-value
// block of the K loop the CTA decodes its MT rows into int8 codes and sub-block scales in
// shared memory (mma_decode.cuh) once, stages the NT tokens' codes, then each warp runs
// mma.sync m16n8k32 (m16n8k16 for the types with 16-value scales) over them: exact int32 sums
// per sub-block, scaled and accumulated in f32. The integer sums are the q8 kernels'; only
// the float order of the scaled terms differs. Needs the prelude, reduce.cuh, q8dot.cuh and
// mma_decode.cuh.

// Bytes per staged row of codes: 256 plus 16 of padding, so the 8 rows x 4 words a fragment
// load touches fall in 32 distinct banks (row stride 68 words = 4 mod 32).
#define MMA_ROW_BYTES 272

// Floats per staged row of scales (16 sub-blocks of 16, or 8 of 32, per block) and per token
// of activation sums: 17, so the 8 rows (or the 4 token pairs) a warp reads at once fall in
// distinct banks; a stride of 16 put rows g and g + 2 in one bank.
#define MMA_SCALES 17

// x (blocks of 256 values back to back) to Q8_K codes `q` and scales `d`, as the q8 kernels
// quantize into shared memory. 4 warps per CTA, MMA_QUANT_BLOCKS blocks per CTA.
#define MMA_QUANT_BLOCKS 16

__global__ void __launch_bounds__(128)
mma_quantize_kernel(const float* __restrict__ x, float* __restrict__ d, i8* __restrict__ q,
                    int blocks) {
    pdl_begin();
    const int first = blockIdx.x * MMA_QUANT_BLOCKS;
    const int here = min(MMA_QUANT_BLOCKS, blocks - first);
    quantize_q8k_blocks([=](int b) { return x + i64(first + b) * Q8K_VALUES; }, here, d + first,
                        q + i64(first) * Q8K_VALUES);
}

// D = A · B + D on int8, A 16 x K row-major (this lane's words per the PTX fragment layout),
// B K x 8 column-major.
static __device__ __forceinline__ void mma_k32(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();  // the launcher never picks these kernels below sm_80
#endif
}

static __device__ __forceinline__ void mma_k16(int (&c)[4], u32 a0, u32 a1, u32 b0) {
#if __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
#else
    __trap();
#endif
}

// The products start from the bits of 1.5 x 2^23: an int32 sum s with |s| < 2^22 (a sub-block
// sum is at most 32 x 63 x 127) then reads as the float 1.5 x 2^23 + s exactly (floats in
// [2^23, 2^24) step by 1), and one subtraction gives s as a float: no int-to-float
// conversion, a quarter-rate instruction that would cost more than the mma.
#define MMA_BIAS_BITS 0x4b400000
#define MMA_BIAS 12582912.0f

static __device__ __forceinline__ u32 smem_u32(const i8* p) {
    return *reinterpret_cast<const u32*>(p);
}

// Dynamic shared memory of mma_matmul_kernel (the launcher computes the same sum).
static __host__ __device__ constexpr int mma_shared_bytes(int mats, int mt, int nt) {
    return mats * mt * MMA_ROW_BYTES + nt * MMA_ROW_BYTES  // codes
           + 2 * mats * mt * MMA_SCALES * 4                // ds, dm
           + nt * MMA_SCALES * 4 + nt * 4 + 2 * nt * 4;    // x sums, d8, rows in / out
}

// Y[out(j)][row] for the MT rows from blockIdx.x * MT and the NT tokens (pairs) of tile
// blockIdx.y. WM x WN warps, each FM x FN fragments of 16 rows x 8 tokens. MATS = 2: gate
// (w0) and up (w1) of the same rows, written as silu(gate) * up.
// Dense (tile_info null): tokens t0 = blockIdx.y * NT.., in = out = t. Experts: tile_info[3y..]
// = (expert, first, count) into `pairs`, the (token, slot) pairs of that expert; in = pair /
// in_div (the token for gate/up, the pair itself for down), out = pair; the expert's rows
// start expert_bytes into w0 / w1.
template <class B, int WM, int WN, int FM, int FN, int MATS>
// Two CTAs per multiprocessor at least: 128 registers per thread for the 8-warp dense shape
// (Q2_K took 173 without the bound, one CTA of 8 warps per multiprocessor).
__global__ void __launch_bounds__(WM * WN * WARP_SIZE, 2)
mma_matmul_kernel(const u8* __restrict__ w0, const u8* __restrict__ w1, i64 expert_bytes,
                  const int* __restrict__ tile_info, const int* __restrict__ pairs, int in_div,
                  const i8* __restrict__ xq, const float* __restrict__ xd,
                  float* __restrict__ y, int rows, int cols, int tokens) {
    pdl_begin();
    typedef MmaDecode<B> D;
    constexpr int MT = WM * FM * 16, NT = WN * FN * 8, THREADS = WM * WN * WARP_SIZE;
    // The IQ2 codebooks in shared memory unless REDLITE_Q8_SHARED_TABLES=0, as the q8 kernels.
    q8_prepare<B>();
    extern __shared__ float4 mma_shared[];
    i8* ws = reinterpret_cast<i8*>(mma_shared);
    i8* xs = ws + MATS * MT * MMA_ROW_BYTES;
    float* ds = reinterpret_cast<float*>(xs + NT * MMA_ROW_BYTES);
    float* dm = ds + MATS * MT * MMA_SCALES;
    float* xsum = dm + MATS * MT * MMA_SCALES;
    float* d8 = xsum + NT * MMA_SCALES;
    int* row_in = reinterpret_cast<int*>(d8 + NT);
    int* row_out = row_in + NT;

    // Not an array: indexed by a runtime matrix number it would live in local memory.
    const u8* w_gate = w0;
    const u8* w_up = w1;
    int count;
    if (tile_info == nullptr) {
        const int t0 = blockIdx.y * NT;
        count = min(NT, tokens - t0);
        for (int j = threadIdx.x; j < NT; j += THREADS) row_in[j] = row_out[j] = t0 + j;
    } else {
        const int expert = tile_info[3 * blockIdx.y];
        const int first = tile_info[3 * blockIdx.y + 1];
        count = tile_info[3 * blockIdx.y + 2];
        // A device grouping sizes the grid for the most tiles the pairs can need; the tiles
        // past its last one are empty (the whole CTA leaves, before any barrier).
        if (count == 0) return;
        for (int j = threadIdx.x; j < NT; j += THREADS) {
            const int pair = j < count ? pairs[first + j] : 0;
            row_in[j] = pair / in_div;
            row_out[j] = pair;
        }
        w_gate += i64(expert) * expert_bytes;
        if (MATS == 2) w_up += i64(expert) * expert_bytes;
    }
    __syncthreads();

    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane >> 2, tig = lane & 3;
    const int wm = warp % WM, wn = warp / WM;
    const int m0 = blockIdx.x * MT;
    const int blocks = cols / Q8K_VALUES;
    const i64 row_bytes = i64(blocks) * B::BYTES;
    // The CTA's rows are contiguous: ask L2 for all of them now, so the decode of every block
    // after the first reads L2 instead of waiting on DRAM.
    const i64 slab = i64(min(MT, rows - m0)) * row_bytes;
    prefetch_l2(w_gate + i64(m0) * row_bytes, slab, threadIdx.x, THREADS);
    if (MATS == 2) prefetch_l2(w_up + i64(m0) * row_bytes, slab, threadIdx.x, THREADS);

    float acc[MATS][FM][FN][4];
#pragma unroll
    for (int m = 0; m < MATS; ++m)
#pragma unroll
        for (int f = 0; f < FM; ++f)
#pragma unroll
            for (int n = 0; n < FN; ++n)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[m][f][n][i] = 0.0f;

    for (int kb = 0; kb < blocks; ++kb) {
        // Stage the tokens' codes (zeros past `count`), their sums per 16 and scales.
        for (int u = threadIdx.x; u < NT * 16; u += THREADS) {
            const int j = u / 16, c = u % 16;
            int4 v = make_int4(0, 0, 0, 0);
            if (j < count) {
                v = *reinterpret_cast<const int4*>(xq + i64(row_in[j]) * cols +
                                                   kb * Q8K_VALUES + 16 * c);
            }
            *reinterpret_cast<int4*>(xs + j * MMA_ROW_BYTES + 16 * c) = v;
            if (D::HAS_MIN) xsum[j * MMA_SCALES + c] = float(q8_sum16(v));  // exact: ≤ 16 x 127
        }
        for (int j = threadIdx.x; j < NT; j += THREADS) {
            d8[j] = j < count ? xd[i64(row_in[j]) * blocks + kb] : 0.0f;
        }
        // Decode the rows' block kb: consecutive threads take consecutive items of a row.
        for (int u = threadIdx.x; u < MATS * MT * 8; u += THREADS) {
            const int mat = u / (MT * 8), r = (u / 8) % MT, item = u % 8;
            const int row = m0 + r;
            u32* codes = reinterpret_cast<u32*>(ws + (mat * MT + r) * MMA_ROW_BYTES + 32 * item);
            float* row_ds = ds + (mat * MT + r) * MMA_SCALES;
            float* row_dm = dm + (mat * MT + r) * MMA_SCALES;
            if (row < rows) {
                D::decode((mat == 0 ? w_gate : w_up) + i64(row) * row_bytes + i64(kb) * B::BYTES, item, codes,
                          row_ds, row_dm);
            } else {
#pragma unroll
                for (int w = 0; w < 8; ++w) codes[w] = 0;
                const int s0 = D::SUB == 16 ? 2 * item : item;
                row_ds[s0] = row_dm[s0] = 0.0f;
                if (D::SUB == 16) row_ds[s0 + 1] = row_dm[s0 + 1] = 0.0f;
            }
        }
        __syncthreads();

        float part[MATS][FM][FN][4];
#pragma unroll
        for (int m = 0; m < MATS; ++m)
#pragma unroll
            for (int f = 0; f < FM; ++f)
#pragma unroll
                for (int n = 0; n < FN; ++n)
#pragma unroll
                    for (int i = 0; i < 4; ++i) part[m][f][n][i] = 0.0f;

// Not unrolled: one step already issues FM x FN (x2 for k16) independent products, and
        // unrolling by 2 spilled IQ2_XXS's and Q2_K's dense shapes at the 128-register bound.
#pragma unroll 1
        for (int s32 = 0; s32 < 8; ++s32) {
            u32 b[FN][2];
            float tok_sum[FN][2][2];  // [n][token of the pair][half]
#pragma unroll
            for (int n = 0; n < FN; ++n) {
                const i8* bp = xs + (wn * FN * 8 + n * 8 + g) * MMA_ROW_BYTES + 32 * s32 + 4 * tig;
                b[n][0] = smem_u32(bp);
                b[n][1] = smem_u32(bp + 16);
                if (D::HAS_MIN) {
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int j = wn * FN * 8 + n * 8 + 2 * tig + e;
                        tok_sum[n][e][0] = xsum[j * MMA_SCALES + 2 * s32];
                        tok_sum[n][e][1] = xsum[j * MMA_SCALES + 2 * s32 + 1];
                    }
                }
            }
#pragma unroll
            for (int m = 0; m < MATS; ++m) {
#pragma unroll
                for (int f = 0; f < FM; ++f) {
                    const int r_lo = m * MT + wm * FM * 16 + f * 16 + g;
                    const i8* ap = ws + r_lo * MMA_ROW_BYTES + 32 * s32 + 4 * tig;
                    const u32 a[4] = {smem_u32(ap), smem_u32(ap + 8 * MMA_ROW_BYTES),
                                      smem_u32(ap + 16), smem_u32(ap + 8 * MMA_ROW_BYTES + 16)};
#pragma unroll
                    for (int h = 0; h < (D::SUB == 16 ? 2 : 1); ++h) {
                        // Sub-block index within the block, its scales for rows g and g + 8.
                        const int s = D::SUB == 16 ? 2 * s32 + h : s32;
                        const float sc[2] = {ds[r_lo * MMA_SCALES + s],
                                             ds[(r_lo + 8) * MMA_SCALES + s]};
                        float mn[2] = {0.0f, 0.0f};
                        if (D::HAS_MIN) {
                            mn[0] = dm[r_lo * MMA_SCALES + s];
                            mn[1] = dm[(r_lo + 8) * MMA_SCALES + s];
                        }
#pragma unroll
                        for (int n = 0; n < FN; ++n) {
                            int c[4] = {MMA_BIAS_BITS, MMA_BIAS_BITS, MMA_BIAS_BITS,
                                        MMA_BIAS_BITS};
                            if (D::SUB == 16) {
                                mma_k16(c, a[2 * h], a[2 * h + 1], b[n][h]);
                            } else {
                                mma_k32(c, a, b[n][0], b[n][1]);
                            }
#pragma unroll
                            for (int i = 0; i < 4; ++i) {
                                const float sum = __int_as_float(c[i]) - MMA_BIAS;
                                float v = fmaf(sc[i >> 1], sum, part[m][f][n][i]);
                                if (D::HAS_MIN) {
                                    const float xs_sum = D::SUB == 16
                                                           ? tok_sum[n][i & 1][h]
                                                           : tok_sum[n][i & 1][0] + tok_sum[n][i & 1][1];
                                    v = fmaf(mn[i >> 1], xs_sum, v);
                                }
                                part[m][f][n][i] = v;
                            }
                        }
                    }
                }
            }
        }
#pragma unroll
        for (int n = 0; n < FN; ++n) {
            const float scale[2] = {d8[wn * FN * 8 + n * 8 + 2 * tig],
                                    d8[wn * FN * 8 + n * 8 + 2 * tig + 1]};
#pragma unroll
            for (int m = 0; m < MATS; ++m)
#pragma unroll
                for (int f = 0; f < FM; ++f)
#pragma unroll
                    for (int i = 0; i < 4; ++i) {
                        acc[m][f][n][i] = fmaf(scale[i & 1], part[m][f][n][i], acc[m][f][n][i]);
                    }
        }
        __syncthreads();
    }

#pragma unroll
    for (int f = 0; f < FM; ++f)
#pragma unroll
        for (int n = 0; n < FN; ++n)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int row = m0 + wm * FM * 16 + f * 16 + g + 8 * (i >> 1);
                const int j = wn * FN * 8 + n * 8 + 2 * tig + (i & 1);
                if (row >= rows || j >= count) continue;
                const float value =
                    MATS == 2 ? siluf(acc[0][f][n][i]) * acc[MATS - 1][f][n][i] : acc[0][f][n][i];
                y[i64(row_out[j]) * rows + row] = value;
            }
}

// The routed experts' weighted sum back in token order (the second pass of the grouped
// down product): out[t][r] = (accumulate ? out[t][r] : 0) + Σ_k weights[t][k] y[t used + k][r],
// k in slot order, skipping slots whose id is out of range (no tile computed them; the q8
// down kernel skips them too). `ids` null: every slot counts. One thread per (t, r); grid
// (ceil(rows / 256), tokens).
__global__ void __launch_bounds__(256)
mma_combine_kernel(const float* __restrict__ y, const float* __restrict__ weights,
                   const int* __restrict__ ids, float* __restrict__ out, int rows, int used,
                   int n_expert, int accumulate) {
    pdl_begin();
    const int r = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (r >= rows) return;
    float sum = 0.0f;
    for (int k = 0; k < used; ++k) {
        const int pair = t * used + k;
        if (ids != nullptr && (ids[pair] < 0 || ids[pair] >= n_expert)) continue;
        sum = fmaf(weights[pair], y[i64(pair) * rows + r], sum);
    }
    float* o = out + i64(t) * rows + r;
    *o = (accumulate ? *o : 0.0f) + sum;
}


// The routed (token, slot) pairs grouped by expert on the device, with no host round trip: one
// CTA counts the pairs of each expert, scans the counts (one warp), writes every tile's
// (expert, first, count), at most `tile` pairs each, into tile_info -- count 0 for the tiles
// past the last, up to `tile_bound`, the grid the launches size from the pair count -- then
// scatters the pairs into `pairs`, each expert's from its `first`. Within an expert the order
// follows the atomics, which changes no value: a pair's sums do not depend on the other pairs
// of its tile. Ids out of range join no tile. Dynamic shared memory: 3 x n_expert ints.
__global__ void __launch_bounds__(1024)
mma_group_kernel(const int* __restrict__ ids, int n_pairs, int n_expert,
                 int* __restrict__ tile_info, int tile_bound, int* __restrict__ pairs, int tile) {
    pdl_begin();
    extern __shared__ int group_shared[];
    __shared__ int total_tiles;
    int* count = group_shared;
    int* first = count + n_expert;
    int* tile_first = first + n_expert;
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert) atomicAdd(&count[e], 1);
    }
    __syncthreads();
    // Exclusive scans of the pair and tile counts by the first warp, 32 experts a step.
    if (threadIdx.x < WARP_SIZE) {
        const int lane = threadIdx.x;
        int pairs_before = 0, tiles_before = 0;
        for (int base = 0; base < n_expert; base += WARP_SIZE) {
            const int e = base + lane;
            const int c = e < n_expert ? count[e] : 0;
            const int t = (c + tile - 1) / tile;
            int c_incl = c, t_incl = t;
#pragma unroll
            for (int offset = 1; offset < WARP_SIZE; offset <<= 1) {
                const int c_up = __shfl_up_sync(0xffffffffu, c_incl, offset);
                const int t_up = __shfl_up_sync(0xffffffffu, t_incl, offset);
                if (lane >= offset) c_incl += c_up, t_incl += t_up;
            }
            if (e < n_expert) {
                first[e] = pairs_before + c_incl - c;
                tile_first[e] = tiles_before + t_incl - t;
            }
            pairs_before += __shfl_sync(0xffffffffu, c_incl, WARP_SIZE - 1);
            tiles_before += __shfl_sync(0xffffffffu, t_incl, WARP_SIZE - 1);
        }
        if (lane == 0) total_tiles = tiles_before;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) {
        for (int k = 0; k * tile < count[e]; ++k) {
            int* info = tile_info + 3 * (tile_first[e] + k);
            info[0] = e;
            info[1] = first[e] + k * tile;
            info[2] = min(tile, count[e] - k * tile);
        }
    }
    for (int t = total_tiles + threadIdx.x; t < tile_bound; t += blockDim.x) {
        tile_info[3 * t] = tile_info[3 * t + 1] = tile_info[3 * t + 2] = 0;
    }
    __syncthreads();
    // count[] becomes each expert's scatter cursor.
    for (int e = threadIdx.x; e < n_expert; e += blockDim.x) count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n_pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert) pairs[first[e] + atomicAdd(&count[e], 1)] = p;
    }
}
