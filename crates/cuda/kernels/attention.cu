// Gated full attention between its projections (spec §3.3): per-head RMSNorm and NEOX
// partial RoPE of q and k, the KV-cache write, attention over the cache with an online
// f32 softmax, and the sigmoid output gate. KV element KV is float or u16 (f16 bits).
// Shapes: qg [T][heads][2][hd] (query | gate per head); k, v [T][kv_heads][hd];
// q [T][heads][hd]; caches [capacity][kv_heads][hd]; o [T][heads][hd].
// Needs the prelude and reduce.cuh.

static __device__ __forceinline__ float kv_load(const float* p) { return *p; }
static __device__ __forceinline__ float kv_load(const u16* p) { return f16_to_f32(*p); }
static __device__ __forceinline__ void kv_store(float* p, float value) { *p = value; }
static __device__ __forceinline__ void kv_store(u16* p, float value) { *p = f32_to_f16(value); }

// In the split kernels a lane holds values lane x VPL ... lane x VPL + VPL - 1 of a head's row,
// so that a K or V row is one 16-byte load a lane (f16 at 256 values a head) instead of VPL
// loads of 2 bytes: +1.9 % at depth 4096 on an H100 (twenty-eighth session). The compile
// option REDLITE_ATTN_WIDE_LOADS=0 keeps the earlier lane, lane + 32, ... (a lane's share of
// q · k sums other products, so the scores and all after them differ by rounding; the sums of
// p v per value keep their order).
#ifndef ATTN_WIDE_LOADS
#define ATTN_WIDE_LOADS 1
#endif

// The index in a head's row of this lane's value e (of VPL) in the split kernels.
template <int VPL>
static __device__ __forceinline__ int head_value(int lane, int e) {
    return ATTN_WIDE_LOADS ? lane * VPL + e : lane + WARP_SIZE * e;
}

// VPL consecutive values from p (16-byte aligned where VPL x sizeof(T) is a multiple of 16)
// as floats: 16-byte loads where they fit, else one load a value. T is float, or u16 holding
// f16 bits.
template <class T, int VPL>
static __device__ __forceinline__ void load_run(const T* p, float (&out)[VPL]) {
    constexpr int BYTES = VPL * int(sizeof(T)), PER_WORD = 4 / int(sizeof(T));
    if constexpr (BYTES % 16 == 0) {
#pragma unroll
        for (int c = 0; c < BYTES / 16; ++c) {
            const uint4 w = reinterpret_cast<const uint4*>(p)[c];
            const u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
            for (int k = 0; k < 4; ++k) {
#pragma unroll
                for (int h = 0; h < PER_WORD; ++h) {
                    const int e = (c * 4 + k) * PER_WORD + h;
                    if constexpr (sizeof(T) == 2) {
                        out[e] = f16_to_f32(u16(words[k] >> (16 * h)));
                    } else {
                        out[e] = __uint_as_float(words[k]);
                    }
                }
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < VPL; ++e) out[e] = kv_load(p + e);
    }
}

// VPL floats to p (16-byte aligned where VPL is a multiple of 4).
template <int VPL>
static __device__ __forceinline__ void store_run(float* p, const float (&v)[VPL]) {
    if constexpr (VPL % 4 == 0) {
#pragma unroll
        for (int c = 0; c < VPL / 4; ++c) {
            reinterpret_cast<float4*>(p)[c] =
                make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
        }
    } else {
#pragma unroll
        for (int e = 0; e < VPL; ++e) p[e] = v[e];
    }
}

// Values of a head's row a lane of attn_prep_kernel: head sizes up to 32 x this.
#define ROPE_PER_LANE 8

// Grid (tokens, heads + kv_heads), one warp, hd floats of dynamic shared memory. Blocks
// y < heads: query head y → q. Others: key head y - heads → k cache at pos0 + t, and the
// value head copied to the v cache. RoPE angles in f64 as the CPU reference computes them.
template <class KV>
__global__ void attn_prep_kernel(const float* __restrict__ qg, const float* __restrict__ k,
                                 const float* __restrict__ v, const float* __restrict__ q_norm,
                                 const float* __restrict__ k_norm, float* __restrict__ q,
                                 KV* __restrict__ k_cache, KV* __restrict__ v_cache,
                                 const u32* __restrict__ pos_dev, int pos0, int heads,
                                 int kv_heads, int hd, int rope_dim, float rope_base, float eps) {
    extern __shared__ float buf[];
    // Before the PDL wait: the position (written before the step), the head's norm weights
    // and this lane's rotation angles (sin and cos in f64, the longest chain of the kernel),
    // none of which the kernels waited for write.
    if (pos_dev != nullptr) pos0 = int(*pos_dev);
    const int t = blockIdx.x, y = blockIdx.y, lane = threadIdx.x;
    const bool is_query = y < heads;
    const int kvh = y - heads;
    const float* w = is_query ? q_norm : k_norm;
    const int pos = pos0 + t, half = rope_dim / 2;
    float w_lane[ROPE_PER_LANE], sn[ROPE_PER_LANE], cs[ROPE_PER_LANE];
#pragma unroll
    for (int u = 0; u < ROPE_PER_LANE; ++u) {
        const int i = lane + u * WARP_SIZE;
        if (i < hd) w_lane[u] = w[i];
        if (i < half) {
            const double inv_freq =
                1.0 / pow(double(rope_base), 2.0 * double(i) / double(rope_dim));
            const double angle = double(pos) * inv_freq;
            sn[u] = float(sin(angle));
            cs[u] = float(cos(angle));
        }
    }
    pdl_begin();
    const float* src = is_query ? qg + (i64(t) * heads + y) * 2 * hd
                                : k + (i64(t) * kv_heads + kvh) * hd;
    // A key head's value row (query heads read none).
    const float* vr = is_query ? v : v + (i64(t) * kv_heads + kvh) * hd;
    // This lane's values of the row, and of a key head's value row, loaded at once: one round
    // trip after the wait, where loading the value row after the RoPE made a second one
    // (+0.2–0.3 % on an H200, the same bits; thirty-sixth session).
    float x[ROPE_PER_LANE], vv[ROPE_PER_LANE];
#pragma unroll
    for (int u = 0; u < ROPE_PER_LANE; ++u) {
        const int i = lane + u * WARP_SIZE;
        if (i < hd) {
            x[u] = src[i];
            if (!is_query) vv[u] = vr[i];
        }
    }
    float ss = 0.0f;
#pragma unroll
    for (int u = 0; u < ROPE_PER_LANE; ++u) {
        if (lane + u * WARP_SIZE < hd) ss += x[u] * x[u];
    }
    ss = warp_reduce_sum(ss);
    const float scale = 1.0f / sqrtf(ss / float(hd) + eps);
#pragma unroll
    for (int u = 0; u < ROPE_PER_LANE; ++u) {
        const int i = lane + u * WARP_SIZE;
        if (i < hd) buf[i] = x[u] * scale * w_lane[u];
    }
    __syncwarp();
#pragma unroll
    for (int u = 0; u < ROPE_PER_LANE; ++u) {
        const int i = lane + u * WARP_SIZE;
        if (i < half) {
            const float a = buf[i], b = buf[i + half];
            buf[i] = a * cs[u] - b * sn[u];
            buf[i + half] = b * cs[u] + a * sn[u];
        }
    }
    __syncwarp();
    if (is_query) {
        float* out = q + (i64(t) * heads + y) * hd;
        for (int i = lane; i < hd; i += WARP_SIZE) out[i] = buf[i];
    } else {
        const i64 at = (i64(pos) * kv_heads + kvh) * hd;
#pragma unroll
        for (int u = 0; u < ROPE_PER_LANE; ++u) {
            const int i = lane + u * WARP_SIZE;
            if (i < hd) {
                kv_store(k_cache + at + i, buf[i]);
                kv_store(v_cache + at + i, vv[u]);
            }
        }
    }
}

// Grid (tokens, heads), WARPS warps. Warp w walks positions w, w + WARPS, … ≤ pos0 + t with
// an online softmax (running max, sum and VPL values per lane of the weighted V sum); the
// warps' partials are merged in shared memory; o = (Σ p v) ⊙ sigmoid(gate). hd = 32 VPL.
template <class KV, int VPL, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
attention_kernel(const float* __restrict__ q, const float* __restrict__ qg,
                 const KV* __restrict__ k_cache, const KV* __restrict__ v_cache,
                 float* __restrict__ o, const u32* __restrict__ pos_dev, int pos0, int heads,
                 int kv_heads, float scale) {
    pdl_begin();
    constexpr int HD = VPL * WARP_SIZE;
    if (pos_dev != nullptr) pos0 = int(*pos_dev);
    __shared__ float m_part[WARPS], l_part[WARPS];
    __shared__ float acc_part[WARPS][HD];
    const int t = blockIdx.x, h = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int kvh = h / (heads / kv_heads);
    const int last = pos0 + t;
    const float* qr = q + (i64(t) * heads + h) * HD;
    float qv[VPL], acc[VPL];
#pragma unroll
    for (int e = 0; e < VPL; ++e) {
        qv[e] = qr[lane + WARP_SIZE * e];
        acc[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    for (int p = warp; p <= last; p += WARPS) {
        const i64 at = (i64(p) * kv_heads + kvh) * HD;
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < VPL; ++e) d += qv[e] * kv_load(k_cache + at + lane + WARP_SIZE * e);
        const float score = warp_reduce_sum(d) * scale;
        const float m_new = fmaxf(m, score);
        const float correction = expf(m - m_new), weight = expf(score - m_new);
        l = l * correction + weight;
#pragma unroll
        for (int e = 0; e < VPL; ++e) {
            acc[e] = acc[e] * correction + weight * kv_load(v_cache + at + lane + WARP_SIZE * e);
        }
        m = m_new;
    }
    if (lane == 0) {
        m_part[warp] = m;
        l_part[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < VPL; ++e) acc_part[warp][lane + WARP_SIZE * e] = acc[e];
    __syncthreads();
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, m_part[w]);
    float l_all = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) l_all += l_part[w] * expf(m_part[w] - m_all);
    const float* gate = qg + (i64(t) * heads + h) * 2 * HD + HD;
    float* out = o + (i64(t) * heads + h) * HD;
    for (int i = threadIdx.x; i < HD; i += WARPS * WARP_SIZE) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) total += acc_part[w][i] * expf(m_part[w] - m_all);
        out[i] = total / l_all * sigmoidf(gate[i]);
    }
}

// Positions base ... base + G - 1 (clamped to end - 1) of KV head kvh: this lane's VPL values
// of each K and V row, all loaded before any is used.
template <class KV, int VPL, int G>
static __device__ __forceinline__ void load_kv_group(const KV* __restrict__ k_cache,
                                                     const KV* __restrict__ v_cache, int base,
                                                     int end, int kv_heads, int kvh, int lane,
                                                     float (&kr)[G][VPL], float (&vr)[G][VPL]) {
    constexpr int HD = VPL * WARP_SIZE;
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const i64 at = (i64(min(base + j, end - 1)) * kv_heads + kvh) * HD;
        if constexpr (ATTN_WIDE_LOADS) {
            load_run<KV, VPL>(k_cache + at + lane * VPL, kr[j]);
            load_run<KV, VPL>(v_cache + at + lane * VPL, vr[j]);
        } else {
#pragma unroll
            for (int e = 0; e < VPL; ++e) {
                kr[j][e] = kv_load(k_cache + at + lane + WARP_SIZE * e);
                vr[j][e] = kv_load(v_cache + at + lane + WARP_SIZE * e);
            }
        }
    }
}

// One query head's scores over a loaded group before the warp's sum: this lane's part of
// q · k for each of the G positions.
template <int VPL, int G>
static __device__ __forceinline__ void group_scores(const float (&qv)[VPL],
                                                    const float (&kr)[G][VPL],
                                                    float (&score)[G]) {
#pragma unroll
    for (int j = 0; j < G; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < VPL; ++e) d += qv[e] * kr[j][e];
        score[j] = d;
    }
}

// One query head's online softmax step over a loaded group, from its summed scores q · k
// (positions from `end` on masked): the running max m, sum l and this lane's VPL values of
// Σ p v.
template <int VPL, int G>
static __device__ __forceinline__ void softmax_update(float (&score)[G],
                                                      const float (&vr)[G][VPL], int base,
                                                      int end, float scale, float& m, float& l,
                                                      float (&acc)[VPL]) {
    float m_new = m;
#pragma unroll
    for (int j = 0; j < G; ++j) {
        score[j] = base + j < end ? score[j] * scale : -INFINITY;
        m_new = fmaxf(m_new, score[j]);
    }
    const float correction = expf(m - m_new);
    l *= correction;
#pragma unroll
    for (int e = 0; e < VPL; ++e) acc[e] *= correction;
#pragma unroll
    for (int j = 0; j < G; ++j) {
        const float weight = expf(score[j] - m_new);
        l += weight;
#pragma unroll
        for (int e = 0; e < VPL; ++e) acc[e] = fmaf(weight, vr[j][e], acc[e]);
    }
    m = m_new;
}

// HPC query heads' online softmaxes over a loaded group: every head's scores, the warp's sums
// of all HPC x G of them at once (warp_reduce_sum_each: the bits of a butterfly each with
// about a third of the shuffles), then each head's softmax step. The query values of head r
// come from qv_of(r, qv).
template <int VPL, int G, int HPC, class QueryOf>
static __device__ __forceinline__ void softmax_groups(QueryOf qv_of, const float (&kr)[G][VPL],
                                                      const float (&vr)[G][VPL], int base,
                                                      int end, float scale, float (&m)[HPC],
                                                      float (&l)[HPC], float (&acc)[HPC][VPL]) {
    float score[HPC][G];
#pragma unroll
    for (int r = 0; r < HPC; ++r) {
        float qv[VPL];
        qv_of(r, qv);
        group_scores<VPL, G>(qv, kr, score[r]);
    }
    warp_reduce_sum_each(score);
#pragma unroll
    for (int r = 0; r < HPC; ++r) {
        softmax_update<VPL, G>(score[r], vr, base, end, scale, m[r], l[r], acc[r]);
    }
}

// A split's partials from its warps' online softmaxes (each warp's running max m, sum l and
// VPL values a lane of Σ p v): merged in shared memory relative to the largest max, into
// partials[row][split] (HD values, then the max and the sum; (0, -inf, 0) where no warp saw a
// position).
template <int VPL, int WARPS>
static __device__ __forceinline__ void merge_split_warps(float m, float l, const float (&acc)[VPL],
                                                         float* m_part, float* l_part,
                                                         float (*acc_part)[VPL * WARP_SIZE],
                                                         float* partials, i64 row, int split) {
    constexpr int HD = VPL * WARP_SIZE;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    // Warps past WARPS (a CTA of more: attention_split_depth_kernel) only meet the barrier.
    if (warp < WARPS) {
        if (lane == 0) {
            m_part[warp] = m;
            l_part[warp] = l;
        }
        if constexpr (ATTN_WIDE_LOADS) {
            store_run<VPL>(&acc_part[warp][lane * VPL], acc);
        } else {
#pragma unroll
            for (int e = 0; e < VPL; ++e) acc_part[warp][lane + WARP_SIZE * e] = acc[e];
        }
    }
    __syncthreads();
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) m_all = fmaxf(m_all, m_part[w]);
    float* out = partials + (row * gridDim.z + split) * (HD + 2);
    const bool empty = m_all == -INFINITY;
    for (int i = threadIdx.x; i < HD && threadIdx.x < WARPS * WARP_SIZE; i += WARPS * WARP_SIZE) {
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) {
            total += empty ? 0.0f : acc_part[w][i] * expf(m_part[w] - m_all);
        }
        out[i] = total;
    }
    if (threadIdx.x == 0) {
        float l_all = 0.0f;
#pragma unroll
        for (int w = 0; w < WARPS; ++w) l_all += empty ? 0.0f : l_part[w] * expf(m_part[w] - m_all);
        out[HD] = m_all;
        out[HD + 1] = l_all;
    }
}

// Under PDL, before the wait: asks L2 for the K and V rows of positions [begin, end) of KV
// head kvh (the caller keeps them below the positions the step's own kernels write), so the
// split's loads after the wait hit L2.
template <class KV>
static __device__ __forceinline__ void prefetch_kv_rows(const KV* k_cache, const KV* v_cache,
                                                        int begin, int end, int kv_heads,
                                                        int kvh, int hd) {
#if REDLITE_PDL
    const int lines = hd * int(sizeof(KV)) / 128;
    for (int i = threadIdx.x; i < (end - begin) * lines; i += blockDim.x) {
        const i64 at = (i64(begin + i / lines) * kv_heads + kvh) * hd;
        const int offset = (i % lines) * 128;
        const u8* k = reinterpret_cast<const u8*>(k_cache + at) + offset;
        const u8* v = reinterpret_cast<const u8*>(v_cache + at) + offset;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(k));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(v));
    }
#endif
}

// The split's chunk: the launch's, or with chunk <= 0 (small batches; a graph replayed at any
// position) ceil(len / splits) of token t's own length over its ceil(len / min_chunk) splits
// (at most grid.z), as the host computes them.
static __device__ __forceinline__ int split_chunk(int chunk, int pos0, int t, int min_chunk) {
    if (chunk > 0) return chunk;
    const int len = pos0 + t + 1;
    const int splits = min((len + min_chunk - 1) / min_chunk, int(gridDim.z));
    return (len + splits - 1) / splits;
}

// A split kernel's start: the chunk of token t (split_chunk) and, under PDL, the first rows of
// its split's K and V of KV head kvh asked of L2 before the wait: one group of G = 4 rows for
// each of its `warps` (their first round), not the whole split, whose requests ran beside
// `attn_prep` and slowed it with f32 KV (with the norms' and routing's orders of the
// thirty-eighth session: +1.1 % at depth 4096, the same bits). pos_dev is written before the
// step, the rows before pos0 by earlier steps: only those are asked for.
template <class KV>
static __device__ __forceinline__ int split_rows_ahead(const KV* k_cache, const KV* v_cache,
                                                       int chunk, int pos0, int t, int split,
                                                       int min_chunk, int kv_heads, int kvh,
                                                       int hd, int warps) {
    chunk = split_chunk(chunk, pos0, t, min_chunk);
    const int first = split * chunk;
    const int ahead = warps * 4;
    prefetch_kv_rows(k_cache, v_cache, first, min(first + min(chunk, ahead), pos0), kv_heads, kvh,
                     hd);
    return chunk;
}

// Flash-decoding, step 1 of 2. Grid (tokens, heads, splits), WARPS warps. Split s covers
// positions [s * chunk, min((s + 1) * chunk, pos0 + t + 1)); its warps walk that range G
// positions at a time (all G K and V rows loaded before the first reduction, so loads
// overlap), keep an online softmax each and merge in shared memory. The split writes
// partials[t][h][s] = (Σ p v relative to its max: HD floats, max, sum); a split past the
// token's last position writes (0, -inf, 0).
// With chunk = 0 (small batches; with pos_dev, a CUDA graph replayed at any position, pos0
// read from device memory) token t uses ceil(len / min_chunk) splits (at most grid.z; the
// rest are empty) and chunk = ceil(len / splits) of its own length len = pos0 + t + 1, as the
// host computes them: each token's sums are those of a one-token launch at its position.
template <class KV, int VPL, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
attention_split_kernel(const float* __restrict__ q, const KV* __restrict__ k_cache,
                       const KV* __restrict__ v_cache, float* __restrict__ partials,
                       const u32* __restrict__ pos_dev, int pos0, int heads, int kv_heads,
                       int chunk, int min_chunk, float scale) {
    PROBE_RETURN(PROBE_ATTENTION);
    constexpr int HD = VPL * WARP_SIZE, G = 4;
    if (pos_dev != nullptr) pos0 = int(*pos_dev);
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    chunk = split_rows_ahead(k_cache, v_cache, chunk, pos0, t, split, min_chunk, kv_heads,
                             h / (heads / kv_heads), HD, WARPS);
    pdl_begin();
    __shared__ float m_part[WARPS], l_part[WARPS];
    __shared__ __align__(16) float acc_part[WARPS][HD];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int kvh = h / (heads / kv_heads);
    const int begin = split * chunk, end = min(begin + chunk, pos0 + t + 1);
    const float* qr = q + (i64(t) * heads + h) * HD;
    float qv[VPL], acc[1][VPL];
#pragma unroll
    for (int e = 0; e < VPL; ++e) {
        qv[e] = qr[head_value<VPL>(lane, e)];
        acc[0][e] = 0.0f;
    }
    float m[1] = {-INFINITY}, l[1] = {0.0f};
    const auto query = [&](int, float (&out)[VPL]) {
#pragma unroll
        for (int e = 0; e < VPL; ++e) out[e] = qv[e];
    };
    for (int base = begin + warp * G; base < end; base += WARPS * G) {
        float kr[G][VPL], vr[G][VPL];
        load_kv_group<KV, VPL, G>(k_cache, v_cache, base, end, kv_heads, kvh, lane, kr, vr);
        softmax_groups<VPL, G, 1>(query, kr, vr, base, end, scale, m, l, acc);
    }
    merge_split_warps<VPL, WARPS>(m[0], l[0], acc[0], m_part, l_part, acc_part, partials,
                                  i64(t) * heads + h, split);
}

// The work of an attention_split_heads_kernel CTA on query heads h0 ... h0 + HPC - 1 of token
// t, split `split`, after the PDL wait, by its first WARPS warps; a CTA of more warps (the
// depth kernel below) has the others idle but at every barrier, so the partials are those of a
// CTA of WARPS warps bit for bit.
template <class KV, int VPL, int WARPS, int HPC>
static __device__ __forceinline__ void split_heads_body(const float* __restrict__ q,
                                                       const KV* __restrict__ k_cache,
                                                       const KV* __restrict__ v_cache,
                                                       float* __restrict__ partials, int t,
                                                       int h0, int split, int chunk, int pos0,
                                                       int heads, int kv_heads, float scale) {
    constexpr int HD = VPL * WARP_SIZE, G = 4;
    __shared__ float m_part[WARPS], l_part[WARPS];
    __shared__ __align__(16) float acc_part[WARPS][HD];
    __shared__ __align__(16) float qs[HPC][HD];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int kvh = h0 / (heads / kv_heads);
    const int begin = split * chunk, end = min(begin + chunk, pos0 + t + 1);
    const float* qr = q + (i64(t) * heads + h0) * HD;
    for (int i = threadIdx.x; i < HPC * HD; i += blockDim.x) qs[i / HD][i % HD] = qr[i];
    __syncthreads();
    float acc[HPC][VPL], m[HPC], l[HPC];
#pragma unroll
    for (int r = 0; r < HPC; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
#pragma unroll
        for (int e = 0; e < VPL; ++e) acc[r][e] = 0.0f;
    }
    const int stop = warp < WARPS ? end : begin;
    for (int base = begin + warp * G; base < stop; base += WARPS * G) {
        float kr[G][VPL], vr[G][VPL];
        load_kv_group<KV, VPL, G>(k_cache, v_cache, base, end, kv_heads, kvh, lane, kr, vr);
        const auto query = [&](int r, float (&out)[VPL]) {
            if constexpr (ATTN_WIDE_LOADS) {
                load_run<float, VPL>(&qs[r][lane * VPL], out);
            } else {
#pragma unroll
                for (int e = 0; e < VPL; ++e) out[e] = qs[r][lane + WARP_SIZE * e];
            }
        };
        softmax_groups<VPL, G, HPC>(query, kr, vr, base, end, scale, m, l, acc);
    }
#pragma unroll
    for (int r = 0; r < HPC; ++r) {
        merge_split_warps<VPL, WARPS>(m[r], l[r], acc[r], m_part, l_part, acc_part, partials,
                                      i64(t) * heads + h0 + r, split);
        // The next head's partials go through the same shared memory.
        __syncthreads();
    }
}

// attention_split_kernel for HPC query heads of one KV head in each CTA: grid (tokens, heads /
// HPC, splits). The split's K and V rows are loaded once for its HPC heads instead of once per
// head (a KV head serves heads / kv_heads query heads: 8 in Qwen3-Next, whose one-head CTAs
// read every row 8 times over). Per head the same positions per warp, the same online softmax
// and the same merge in the same order as attention_split_kernel: the same partials, bit for
// bit.
template <class KV, int VPL, int WARPS, int HPC>
__global__ void __launch_bounds__(WARPS * WARP_SIZE, WARPS >= 8 && HPC <= 4 ? 2 : 1)
attention_split_heads_kernel(const float* __restrict__ q, const KV* __restrict__ k_cache,
                             const KV* __restrict__ v_cache, float* __restrict__ partials,
                             const u32* __restrict__ pos_dev, int pos0, int heads, int kv_heads,
                             int chunk, int min_chunk, float scale) {
    PROBE_RETURN(PROBE_ATTENTION);
    constexpr int HD = VPL * WARP_SIZE;
    if (pos_dev != nullptr) pos0 = int(*pos_dev);
    const int t = blockIdx.x, h0 = blockIdx.y * HPC, split = blockIdx.z;
    chunk = split_rows_ahead(k_cache, v_cache, chunk, pos0, t, split, min_chunk, kv_heads,
                             h0 / (heads / kv_heads), HD, WARPS);
    pdl_begin();
    split_heads_body<KV, VPL, WARPS, HPC>(q, k_cache, v_cache, partials, t, h0, split, chunk,
                                          pos0, heads, kv_heads, scale);
}

// The split kernel chosen by depth, token by token (`REDLITE_ATTN_LONG_FROM`): grid (tokens,
// heads / 4, splits), 8 warps. A token whose length is below long_len takes the partials of
// attention_split_heads_kernel<KV, VPL, 4, 4> (CTA y: query heads 4y ... 4y + 3, warps 0-3),
// one at least long_len those of <KV, VPL, 8, 8> (CTA y even: heads 4y ... 4y + 7 with all 8
// warps; odd CTAs nothing), bit for bit: four heads and four warps measured fastest at depth
// 4096, eight and eight at 32768 (H200, eighteenth session: 290.3 against 274.0 t/s). One
// launch for every depth, so a graph replayed at any position, and an MTP verification's rows,
// each get their own length's kernel. Needs 8 query heads to a KV head.
template <class KV, int VPL>
__global__ void __launch_bounds__(8 * WARP_SIZE)
attention_split_depth_kernel(const float* __restrict__ q, const KV* __restrict__ k_cache,
                             const KV* __restrict__ v_cache, float* __restrict__ partials,
                             const u32* __restrict__ pos_dev, int pos0, int heads, int kv_heads,
                             int chunk, int min_chunk, float scale, int long_len) {
    PROBE_RETURN(PROBE_ATTENTION);
    constexpr int HD = VPL * WARP_SIZE;
    if (pos_dev != nullptr) pos0 = int(*pos_dev);
    const int t = blockIdx.x, h0 = blockIdx.y * 4, split = blockIdx.z;
    const bool long_token = pos0 + t + 1 >= long_len;
    if (long_token && blockIdx.y % 2 != 0) {
        pdl_begin();
        return;
    }
    chunk = split_rows_ahead(k_cache, v_cache, chunk, pos0, t, split, min_chunk, kv_heads,
                             h0 / (heads / kv_heads), HD, long_token ? 8 : 4);
    pdl_begin();
    if (long_token) {
        split_heads_body<KV, VPL, 8, 8>(q, k_cache, v_cache, partials, t, h0, split, chunk, pos0,
                                        heads, kv_heads, scale);
    } else {
        split_heads_body<KV, VPL, 4, 4>(q, k_cache, v_cache, partials, t, h0, split, chunk, pos0,
                                        heads, kv_heads, scale);
    }
}
