// Flash-style attention for prompts (spec §3.3), in the attention module after attention.cu
// (kv_load) and reduce.cuh. A CTA owns a tile of query rows of one KV head: PREFILL_ROWS rows,
// row r = (token t0 + r / group, query head kvh * group + r % group), group = heads /
// kv_heads, so the query heads sharing the KV head read each K and V row once per CTA. It
// walks the cache PREFILL_BK positions at a time, the tile in shared memory, with an online
// f32 softmax per row; query t at position pos0 + t sees positions ≤ pos0 + t (the prompt's
// own K and V are already in the cache). Shapes as in attention.cu.

#define PREFILL_WARPS 8
// Rows per warp, rows per CTA and cache positions per tile (two per lane).
#define PREFILL_RW 8
#define PREFILL_ROWS (PREFILL_WARPS * PREFILL_RW)
#define PREFILL_BK 64

// Floats of the dynamic shared memory: q rows, K rows (padded by 4 floats so the lanes'
// 16-byte loads of different positions fall in different banks), V rows, and per warp the
// tile's probabilities as [position][row]. The launcher computes the same in bytes.
template <int HD>
__host__ __device__ constexpr int prefill_shared_floats() {
    return PREFILL_ROWS * HD + PREFILL_BK * (HD + 4) + PREFILL_BK * HD +
           PREFILL_WARPS * PREFILL_BK * PREFILL_RW;
}

// Grid (query tiles, kv_heads, splits), PREFILL_WARPS warps, prefill_shared_floats<HD>() * 4
// bytes of dynamic shared memory. Tile x takes tokens from the end (tiles of late tokens walk
// the most positions, so they start first). Split s covers positions [s * chunk, (s + 1) *
// chunk). With one split the CTA writes o = (Σ p v) / (Σ p) ⊙ sigmoid(gate); with several
// it writes partials[t][h][s] = (Σ p v, max, Σ p) for attention_combine_kernel, as
// attention_split_kernel does ((0, -inf, 0) when the row sees none of the split).
// Warp w owns rows w * RW ..; in the scores lane l owns positions l and l + 32 of the tile, in
// the weighted sum the dims c * 32 W + l * W + i (W = min(4, HD / 32) consecutive dims).
template <class KV, int HD>
__global__ void __launch_bounds__(PREFILL_WARPS * WARP_SIZE, 1)
attention_prefill_kernel(const float* __restrict__ q, const float* __restrict__ qg,
                         const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
                         float* __restrict__ o, float* __restrict__ partials, int tokens,
                         int pos0, int heads, int kv_heads, int chunk, float scale) {
    pdl_begin();
    constexpr int RW = PREFILL_RW, BK = PREFILL_BK, KS = HD + 4, THREADS = PREFILL_WARPS * 32;
    constexpr int VPL = HD / WARP_SIZE, W = VPL < 4 ? VPL : 4, GROUPS = VPL / W;
    static_assert(RW % 4 == 0 && BK == 2 * WARP_SIZE && HD % 64 == 0, "tile shape");
    extern __shared__ float prefill_shared[];
    float* q_tile = prefill_shared;
    float* k_tile = q_tile + PREFILL_ROWS * HD;
    float* v_tile = k_tile + BK * KS;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    float* p_tile = v_tile + BK * HD + warp * BK * RW;

    const int group = heads / kv_heads, per_tile = PREFILL_ROWS / group;
    const int tile = int(gridDim.x) - 1 - int(blockIdx.x), kvh = blockIdx.y, split = blockIdx.z;
    const int t0 = tile * per_tile, t_end = min(t0 + per_tile, tokens);
    const int row_end = (t_end - t0) * group;

    // Query rows (zero past the tile's tokens).
    for (int i = threadIdx.x; i < PREFILL_ROWS * HD; i += THREADS) {
        const int r = i / HD, d = i % HD;
        const int t = t0 + r / group, h = kvh * group + r % group;
        q_tile[i] = r < row_end ? q[(i64(t) * heads + h) * HD + d] : 0.0f;
    }
    // The last position each of the warp's rows sees (-1: no row).
    int last[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int row = warp * RW + r;
        last[r] = row < row_end ? pos0 + t0 + row / group : -1;
    }
    const int begin = split * chunk;
    const int end = min(begin + chunk, pos0 + t_end);

    float acc[RW][VPL], m[RW], l[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < VPL; ++e) acc[r][e] = 0.0f;
    }

    for (int base = begin; base < end; base += BK) {
        __syncthreads();  // the previous tile's K and V are no longer read
        // Unrolled so that many loads are in flight before the first store waits on one: the
        // CTA computes nothing while its tile loads (one CTA per multiprocessor at hd 256).
#pragma unroll 16
        for (int n = 0; n < BK * HD / THREADS; ++n) {
            const int i = threadIdx.x + n * THREADS;
            const int j = i / HD, d = i % HD, p = base + j;
            const i64 at = (i64(p) * kv_heads + kvh) * HD + d;
            // Zeros past the range: a masked position then adds 0 * 0, never 0 * garbage.
            k_tile[j * KS + d] = p < end ? kv_load(k_cache + at) : 0.0f;
            v_tile[i] = p < end ? kv_load(v_cache + at) : 0.0f;
        }
        __syncthreads();

        // Scores of the warp's rows against positions lane and lane + 32.
        float s[RW][2];
#pragma unroll
        for (int r = 0; r < RW; ++r) s[r][0] = s[r][1] = 0.0f;
        const float* k0 = k_tile + lane * KS;
        const float* k1 = k_tile + (lane + 32) * KS;
        const float* qw = q_tile + warp * RW * HD;
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
            const float4 a = *reinterpret_cast<const float4*>(k0 + d);
            const float4 b = *reinterpret_cast<const float4*>(k1 + d);
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const float4 x = *reinterpret_cast<const float4*>(qw + r * HD + d);
                s[r][0] = fmaf(x.x, a.x, s[r][0]);
                s[r][0] = fmaf(x.y, a.y, s[r][0]);
                s[r][0] = fmaf(x.z, a.z, s[r][0]);
                s[r][0] = fmaf(x.w, a.w, s[r][0]);
                s[r][1] = fmaf(x.x, b.x, s[r][1]);
                s[r][1] = fmaf(x.y, b.y, s[r][1]);
                s[r][1] = fmaf(x.z, b.z, s[r][1]);
                s[r][1] = fmaf(x.w, b.w, s[r][1]);
            }
        }

        // Online softmax: the tile's max per row, then the weights relative to the new max.
        float p[RW][2];
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const int limit = min(last[r] + 1, end);
            const float s0 = base + lane < limit ? s[r][0] * scale : -INFINITY;
            const float s1 = base + lane + 32 < limit ? s[r][1] * scale : -INFINITY;
            const float m_new = fmaxf(m[r], warp_reduce_max(fmaxf(s0, s1)));
            // A row that has seen nothing yet keeps max -inf; 0 stands in so no inf - inf.
            const float m_use = m_new == -INFINITY ? 0.0f : m_new;
            const float correction = expf(m[r] - m_use);
            p[r][0] = expf(s0 - m_use);
            p[r][1] = expf(s1 - m_use);
            // Each lane sums its own weights; the lanes' sums are added at the end.
            l[r] = l[r] * correction + p[r][0] + p[r][1];
            m[r] = m_new;
#pragma unroll
            for (int e = 0; e < VPL; ++e) acc[r][e] *= correction;
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            float4* dst = reinterpret_cast<float4*>(p_tile + (lane + 32 * c) * RW);
#pragma unroll
            for (int r = 0; r < RW; r += 4) {
                dst[r / 4] = make_float4(p[r][c], p[r + 1][c], p[r + 2][c], p[r + 3][c]);
            }
        }
        __syncwarp();

        // Weighted V sum over the tile's positions (zero weight past the rows' limits).
        const int count = min(BK, end - base);
        for (int j = 0; j < count; ++j) {
            float w[RW];
#pragma unroll
            for (int r = 0; r < RW; r += 4) {
                const float4 x = *reinterpret_cast<const float4*>(p_tile + j * RW + r);
                w[r] = x.x;
                w[r + 1] = x.y;
                w[r + 2] = x.z;
                w[r + 3] = x.w;
            }
            const float* vr = v_tile + j * HD + lane * W;
#pragma unroll
            for (int c = 0; c < GROUPS; ++c) {
                float v[W];
                if constexpr (W == 4) {
                    const float4 x = *reinterpret_cast<const float4*>(vr + c * 32 * W);
                    v[0] = x.x;
                    v[1] = x.y;
                    v[2] = x.z;
                    v[3] = x.w;
                } else {
#pragma unroll
                    for (int i = 0; i < W; ++i) v[i] = vr[c * 32 * W + i];
                }
#pragma unroll
                for (int r = 0; r < RW; ++r) {
#pragma unroll
                    for (int i = 0; i < W; ++i) acc[r][c * W + i] = fmaf(w[r], v[i], acc[r][c * W + i]);
                }
            }
        }
        __syncwarp();  // p_tile is rewritten by the next tile
    }

    const int splits = gridDim.z;
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const float l_row = warp_reduce_sum(l[r]);
        if (last[r] < 0) continue;
        const int row = warp * RW + r;
        const int t = t0 + row / group, h = kvh * group + row % group;
        const i64 th = i64(t) * heads + h;
        if (splits == 1) {
            const float* gate = qg + th * 2 * HD + HD;
            float* out = o + th * HD;
#pragma unroll
            for (int c = 0; c < GROUPS; ++c) {
#pragma unroll
                for (int i = 0; i < W; ++i) {
                    const int d = c * 32 * W + lane * W + i;
                    out[d] = acc[r][c * W + i] / l_row * sigmoidf(gate[d]);
                }
            }
        } else {
            float* out = partials + (th * splits + split) * (HD + 2);
#pragma unroll
            for (int c = 0; c < GROUPS; ++c) {
#pragma unroll
                for (int i = 0; i < W; ++i) out[c * 32 * W + lane * W + i] = acc[r][c * W + i];
            }
            if (lane == 0) {
                out[HD] = m[r];
                out[HD + 1] = l_row;
            }
        }
    }
}
