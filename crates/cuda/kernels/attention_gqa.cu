// The GQA attention decode split (`REDLITE_ATTN_GQA=1`, off by default): flash-decoding step
// 1 with one CTA for all the query heads of a KV head. Its partials are merged by
// attention_combine_kernel (attention.cu). Needs attention.cu before it (split_rows_ahead)
// and reduce.cuh.

// N consecutive KV values of one row read as floats through vector loads (the GQA split
// kernel's K quarters and V runs): float4s for f32; for f16 the raw halves stay packed two
// to a register until `get` widens one. p is aligned to the run's bytes (rows of hd values,
// runs starting at multiples of their length).
template <class KV, int N>
struct KvRun;

template <int N>
struct KvRun<float, N> {
    float v[N];
    __device__ __forceinline__ void load(const float* p) {
        if constexpr (N % 4 == 0) {
#pragma unroll
            for (int i = 0; i < N; i += 4) {
                const float4 f = *reinterpret_cast<const float4*>(p + i);
                v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i) v[i] = p[i];
        }
    }
    __device__ __forceinline__ float get(int i) const { return v[i]; }
};

template <int N>
struct KvRun<u16, N> {
    static_assert(N % 2 == 0, "f16 runs of whole 32-bit words");
    u32 w[N / 2];
    __device__ __forceinline__ void load(const u16* p) {
        if constexpr (N % 8 == 0) {
#pragma unroll
            for (int i = 0; i < N / 2; i += 4) {
                const uint4 u = *reinterpret_cast<const uint4*>(p + 2 * i);
                w[i] = u.x, w[i + 1] = u.y, w[i + 2] = u.z, w[i + 3] = u.w;
            }
        } else {
#pragma unroll
            for (int i = 0; i < N / 2; ++i) w[i] = reinterpret_cast<const u32*>(p)[i];
        }
    }
    __device__ __forceinline__ float get(int i) const {
        return f16_to_f32(u16(i % 2 == 0 ? w[i / 2] & 0xffffu : w[i / 2] >> 16));
    }
};

// Flash-decoding step 1 for grouped-query attention (`REDLITE_ATTN_GQA=1`): one CTA for all
// GROUP query heads of a KV head, grid (tokens, kv_heads, splits), GQA_WARPS warps, the
// splits and partials of attention_split_kernel (per head: Σ p v relative to its max, the
// max, the sum; empty splits (0, -inf, 0)), merged by attention_combine_kernel.
// The grouped split kernels above reduce every (position, head) score across the whole warp
// (five dependent shuffle rounds) and walk a CTA's heads one after the other. Here a warp
// scores GQA_TILE positions at a time, four lanes a position: lane (quarter, slot) sums
// q · k over a quarter of the dims for all GROUP heads (its K quarter loaded once, q read
// from shared memory by the 8 lanes of a quarter at once), two shuffles join the quarters,
// and the GROUP heads' sums run side by side. Then per head the tile's max (three rounds),
// the weights p into shared memory, and each lane adds p v over the tile for its VPL dims of
// every head. A tile's K and V rows are loaded before either is used. The sums differ from
// the grouped kernels' (q · k by quarters, each in dim order): other bits, the same math.
#define GQA_WARPS 4
#define GQA_TILE 8
template <class KV, int VPL, int GROUP>
__global__ void __launch_bounds__(GQA_WARPS * WARP_SIZE)
attention_split_gqa_kernel(const float* __restrict__ q, const KV* __restrict__ k_cache,
                           const KV* __restrict__ v_cache, float* __restrict__ partials,
                           const u32* __restrict__ pos_dev, int pos0, int heads, int kv_heads,
                           int chunk, int min_chunk, float scale) {
    PROBE_RETURN(PROBE_ATTENTION);
    constexpr int HD = VPL * WARP_SIZE, QUARTER = HD / 4;
    static_assert(WARP_SIZE / GQA_TILE == 4, "four lanes a position");
    static_assert(GROUP % 4 == 0 && QUARTER % 4 == 0, "float4 reads of p and q");
    if (pos_dev != nullptr) pos0 = int(*pos_dev);
    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    chunk = split_rows_ahead(k_cache, v_cache, chunk, pos0, t, split, min_chunk, kv_heads, kvh, HD);
    pdl_begin();
    const int begin = split * chunk, end = min(begin + chunk, pos0 + t + 1);
    // The split's partials for query head h of the KV head.
    const auto out_of = [&](int h) {
        return partials + ((i64(t) * heads + i64(kvh) * GROUP + h) * gridDim.z + split) * (HD + 2);
    };
    if (begin >= end) {
        // Past the token's last position (a graph launches every split at every depth): the
        // empty partials the merge below would write, without staging q.
        for (int i = threadIdx.x; i < GROUP * (HD + 2); i += blockDim.x) {
            const int h = i / (HD + 2), d = i % (HD + 2);
            out_of(h)[d] = d == HD ? -INFINITY : 0.0f;
        }
        return;
    }
    __shared__ __align__(16) float qs[GROUP][HD];
    __shared__ __align__(16) float ps[GQA_WARPS][GQA_TILE][GROUP];
    __shared__ __align__(16) float acc_part[GQA_WARPS][GROUP][HD];
    __shared__ float m_part[GQA_WARPS][GROUP], l_part[GQA_WARPS][GROUP];
    __shared__ float factor[GQA_WARPS][GROUP];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int quarter = lane / GQA_TILE, slot = lane % GQA_TILE;
    const float* qr = q + (i64(t) * heads + i64(kvh) * GROUP) * HD;
    for (int i = threadIdx.x; i < GROUP * HD / 4; i += blockDim.x) {
        reinterpret_cast<float4*>(&qs[0][0])[i] = reinterpret_cast<const float4*>(qr)[i];
    }
    __syncthreads();
    float m[GROUP], l[GROUP], acc[GROUP][VPL];
#pragma unroll
    for (int h = 0; h < GROUP; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < VPL; ++e) acc[h][e] = 0.0f;
    }
    for (int base = begin + warp * GQA_TILE; base < end; base += GQA_WARPS * GQA_TILE) {
        // Positions past the split's end read the last one's rows (finite) and weigh 0.
        const i64 row = i64(min(base + slot, end - 1)) * kv_heads + kvh;
        KvRun<KV, QUARTER> kq;
        kq.load(k_cache + row * HD + quarter * QUARTER);
        KvRun<KV, VPL> vr[GQA_TILE];
#pragma unroll
        for (int j = 0; j < GQA_TILE; ++j) {
            const i64 vrow = i64(min(base + j, end - 1)) * kv_heads + kvh;
            vr[j].load(v_cache + vrow * HD + lane * VPL);
        }
        float s[GROUP];
#pragma unroll
        for (int h = 0; h < GROUP; ++h) s[h] = 0.0f;
#pragma unroll
        for (int c = 0; c < QUARTER; c += 4) {
            const float k0 = kq.get(c), k1 = kq.get(c + 1), k2 = kq.get(c + 2), k3 = kq.get(c + 3);
#pragma unroll
            for (int h = 0; h < GROUP; ++h) {
                const float4 a = *reinterpret_cast<const float4*>(&qs[h][quarter * QUARTER + c]);
                s[h] = fmaf(a.x, k0, s[h]);
                s[h] = fmaf(a.y, k1, s[h]);
                s[h] = fmaf(a.z, k2, s[h]);
                s[h] = fmaf(a.w, k3, s[h]);
            }
        }
        float p[GROUP], correction[GROUP];
#pragma unroll
        for (int h = 0; h < GROUP; ++h) {
            // Quarters 0 + 1 and 2 + 3, then the two halves: the four lanes of a position end
            // with the same score (each add is commutative).
            s[h] += __shfl_xor_sync(0xffffffffu, s[h], GQA_TILE);
            s[h] += __shfl_xor_sync(0xffffffffu, s[h], 2 * GQA_TILE);
            s[h] = base + slot < end ? s[h] * scale : -INFINITY;
            float tile_max = s[h];
#pragma unroll
            for (int offset = 1; offset < GQA_TILE; offset *= 2) {
                tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, offset));
            }
            // Finite: the tile's first position is below end.
            const float m_new = fmaxf(m[h], tile_max);
            correction[h] = expf(m[h] - m_new);
            p[h] = expf(s[h] - m_new);
            // Each position's weight counted once, by its quarter-0 lane; summed at the end.
            l[h] = l[h] * correction[h] + (quarter == 0 ? p[h] : 0.0f);
            m[h] = m_new;
        }
        if (quarter == 0) {
#pragma unroll
            for (int h = 0; h < GROUP; h += 4) {
                *reinterpret_cast<float4*>(&ps[warp][slot][h]) =
                    make_float4(p[h], p[h + 1], p[h + 2], p[h + 3]);
            }
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < GROUP; ++h) {
#pragma unroll
            for (int e = 0; e < VPL; ++e) acc[h][e] *= correction[h];
        }
#pragma unroll
        for (int j = 0; j < GQA_TILE; ++j) {
            float pj[GROUP];
#pragma unroll
            for (int h = 0; h < GROUP; h += 4) {
                const float4 f = *reinterpret_cast<const float4*>(&ps[warp][j][h]);
                pj[h] = f.x, pj[h + 1] = f.y, pj[h + 2] = f.z, pj[h + 3] = f.w;
            }
#pragma unroll
            for (int e = 0; e < VPL; ++e) {
                const float ve = vr[j].get(e);
#pragma unroll
                for (int h = 0; h < GROUP; ++h) acc[h][e] = fmaf(pj[h], ve, acc[h][e]);
            }
        }
        // The next tile rewrites ps.
        __syncwarp();
    }
    // The warps' partials, merged relative to each head's largest max.
#pragma unroll
    for (int h = 0; h < GROUP; ++h) {
        const float lw = warp_reduce_sum(l[h]);
        if (lane == 0) {
            m_part[warp][h] = m[h];
            l_part[warp][h] = lw;
        }
#pragma unroll
        for (int e = 0; e < VPL; ++e) acc_part[warp][h][lane * VPL + e] = acc[h][e];
    }
    __syncthreads();
    if (threadIdx.x < GROUP) {
        const int h = threadIdx.x;
        float most = -INFINITY;
#pragma unroll
        for (int w = 0; w < GQA_WARPS; ++w) most = fmaxf(most, m_part[w][h]);
        float l_all = 0.0f;
#pragma unroll
        for (int w = 0; w < GQA_WARPS; ++w) {
            // A warp that saw no position (m = -inf) weighs 0; a split that saw none is empty.
            factor[w][h] = most == -INFINITY ? 0.0f : expf(m_part[w][h] - most);
            l_all += l_part[w][h] * factor[w][h];
        }
        out_of(h)[HD] = most;
        out_of(h)[HD + 1] = l_all;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < GROUP * HD; i += blockDim.x) {
        const int h = i / HD, d = i % HD;
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < GQA_WARPS; ++w) total += acc_part[w][h][d] * factor[w][h];
        out_of(h)[d] = total;
    }
}
