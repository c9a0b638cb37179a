// Flash-decoding's merge of the splits. A split's partials are (Σ p v relative to its max:
// hd floats, its max m_s, its sum l_s); split 0 always holds position 0, so the overall max is
// finite; a split past the token's last position holds (0, -inf, 0).
// Needs the prelude and reduce.cuh.

// COMBINE_LANE_SPLITS splits' maxima and sums a lane loaded at once.
#define COMBINE_LANE_SPLITS 4

// By the first warp of a combine CTA: each split's sum l_s into l_of[s] and its factor
// e^(m_s - m) into factor[s] (-1 for an empty split, l_s = 0), m the largest m_s. Ends with the
// warp's lanes in step.
static __device__ __forceinline__ void combine_factors(const float* __restrict__ part, int hd,
                                                       int splits, int lane, float* factor,
                                                       float* l_of) {
    float m_all = -INFINITY;
    for (int first = 0; first < splits; first += COMBINE_LANE_SPLITS * WARP_SIZE) {
        float ms[COMBINE_LANE_SPLITS], ls[COMBINE_LANE_SPLITS];
#pragma unroll
        for (int u = 0; u < COMBINE_LANE_SPLITS; ++u) {
            const int s = first + lane + WARP_SIZE * u;
            ms[u] = s < splits ? part[s * (hd + 2) + hd] : -INFINITY;
            ls[u] = s < splits ? part[s * (hd + 2) + hd + 1] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < COMBINE_LANE_SPLITS; ++u) {
            const int s = first + lane + WARP_SIZE * u;
            if (s < splits) {
                factor[s] = ms[u];
                l_of[s] = ls[u];
            }
            m_all = fmaxf(m_all, ms[u]);
        }
    }
    m_all = warp_reduce_max(m_all);
    __syncwarp();
    for (int s = lane; s < splits; s += WARP_SIZE) {
        factor[s] = l_of[s] == 0.0f ? -1.0f : expf(factor[s] - m_all);
    }
    __syncwarp();
}

// Flash-decoding, step 2 of 2. Grid (tokens, heads, column slices of blockDim values), any
// block size; dynamic shared memory `splits` floats, `splits` floats and `splits` ints: merges
// the splits' partials (split 0 always holds position 0, so the overall max is finite; a split
// past the token's last position holds (0, -inf, 0)) and applies the sigmoid gate:
// o = (Σ_s e^(m_s - m) acc_s) / (Σ_s e^(m_s - m) l_s) ⊙ sigmoid(gate).
// The first warp finds m, each split's factor e^(m_s - m) and the list of non-empty splits in
// increasing order; the sums then run over those splits only, in that order (an empty split
// adds nothing). A graph launches every split at every position, so at short depths most are
// empty. The loads a sum needs are written ahead of its terms (each lane's maxima and sums of
// COMBINE_LANE_SPLITS splits at once; each thread's values of COMBINE_BATCH live splits at
// once, a load past the live count reading the last live split again): fewer L2 round trips
// than batches of 16 (four at depth 4096; ptxas still starts the sums before the last loads),
// the same expressions in the same order. H200: 7.46 -> 5.84 us a launch at depth 4096 (a
// batch of 64, one round trip at 4096: H100 -0.5 % at depth 0, +0.2 % at 4096; not kept).
// Dynamic shared memory: splits x (factor, l, list entry).
#define COMBINE_BATCH 32
__global__ void attention_combine_kernel(const float* __restrict__ partials,
                                         const float* __restrict__ qg, float* __restrict__ o,
                                         int heads, int hd, int splits) {
    pdl_begin();
    extern __shared__ float factor[];
    float* l_of = factor + splits;
    int* live = reinterpret_cast<int*>(l_of + splits);
    __shared__ float l_shared;
    __shared__ int n_live;
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x % WARP_SIZE;
    const float* part = partials + (i64(t) * heads + h) * splits * (hd + 2);
    if (threadIdx.x < WARP_SIZE) {
        combine_factors(part, hd, splits, lane, factor, l_of);
        int count = 0;
        for (int base = 0; base < splits; base += WARP_SIZE) {
            const int s = base + lane;
            const float l = s < splits ? l_of[s] : 0.0f;
            const unsigned mask = __ballot_sync(0xffffffffu, l != 0.0f);
            if (l != 0.0f) live[count + __popc(mask & ((1u << lane) - 1u))] = s;
            count += __popc(mask);
        }
        __syncwarp();
        if (lane == 0) {
            float l_all = 0.0f;
            int j = 0;
            for (; j + 16 <= count; j += 16) {
                float ls[16], fs[16];
#pragma unroll
                for (int u = 0; u < 16; ++u) {
                    ls[u] = l_of[live[j + u]];
                    fs[u] = factor[live[j + u]];
                }
#pragma unroll
                for (int u = 0; u < 16; ++u) l_all += ls[u] * fs[u];
            }
            for (; j < count; ++j) {
                const int s = live[j];
                l_all += l_of[s] * factor[s];
            }
            l_shared = l_all;
            n_live = count;
        }
    }
    __syncthreads();
    const float l_all = l_shared;
    const int count = n_live;
    const float* gate = qg + (i64(t) * heads + h) * 2 * hd + hd;
    float* out = o + (i64(t) * heads + h) * hd;
    for (int i = blockIdx.z * blockDim.x + threadIdx.x; i < hd; i += gridDim.z * blockDim.x) {
        float total = 0.0f;
        for (int j = 0; j < count; j += COMBINE_BATCH) {
            float value[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; ++u) {
                // Past the live count: the last live split's value again (added by nobody),
                // so that the loads need no predicate.
                value[u] = part[live[min(j + u, count - 1)] * (hd + 2) + i];
            }
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; ++u) {
                if (j + u < count) total += value[u] * factor[live[j + u]];
            }
        }
        out[i] = total / l_all * sigmoidf(gate[i]);
    }
}

// attention_combine_kernel with the values loaded first (the default;
// `REDLITE_COMBINE_AHEAD=0` keeps the kernel above). A thread's column of the first
// COMBINE_AHEAD splits is loaded right after the wait, beside the first warp's loads of the
// maxima and sums, where the kernel above loads it after the list of live splits is built and
// summed: one L2 round trip before the sums instead of three at depth 4096 (two at 0). Then each
// thread walks the splits in increasing order and, for a live one (l_s != 0, the list's
// criterion), adds l_s e^(m_s - m) to its sum of l (lane 0's sum above, in the same order) and
// acc_s e^(m_s - m) to its value's: the same products added in the same order, so the same
// bits. Splits past COMBINE_AHEAD (only with `REDLITE_ATTN_MAX_SPLITS` above it) are loaded where
// they are added. Grid (tokens, heads, column slices of blockDim values) covering hd: one column
// a thread. Dynamic shared memory: splits x (factor, l).
#define COMBINE_AHEAD 64
__global__ void attention_combine_ahead_kernel(const float* __restrict__ partials,
                                               const float* __restrict__ qg,
                                               float* __restrict__ o, int heads, int hd,
                                               int splits) {
    pdl_begin();
    extern __shared__ float factor[];
    float* l_of = factor + splits;
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x % WARP_SIZE;
    const float* part = partials + (i64(t) * heads + h) * splits * (hd + 2);
    const int i = blockIdx.z * blockDim.x + threadIdx.x;
    // A thread past the head's last column loads that column and writes nothing.
    const int column = min(i, hd - 1);
    float value[COMBINE_AHEAD];
#pragma unroll
    for (int s = 0; s < COMBINE_AHEAD; ++s) {
        value[s] = part[min(s, splits - 1) * (hd + 2) + column];
    }
    const float gate = qg[(i64(t) * heads + h) * 2 * hd + hd + column];
    if (threadIdx.x < WARP_SIZE) combine_factors(part, hd, splits, lane, factor, l_of);
    __syncthreads();
    float total = 0.0f, l_all = 0.0f;
#pragma unroll
    for (int s = 0; s < COMBINE_AHEAD; ++s) {
        const float l = s < splits ? l_of[s] : 0.0f;
        if (l != 0.0f) {
            const float f = factor[s];
            l_all += l * f;
            total += value[s] * f;
        }
    }
    for (int s = COMBINE_AHEAD; s < splits; ++s) {
        const float l = l_of[s];
        if (l != 0.0f) {
            const float f = factor[s];
            l_all += l * f;
            total += part[s * (hd + 2) + column] * f;
        }
    }
    if (i < hd) o[(i64(t) * heads + h) * hd + i] = total / l_all * sigmoidf(gate);
}
