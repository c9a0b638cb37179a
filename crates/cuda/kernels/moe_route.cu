// The MoE routing on the GPU (softmax, top-k, renormalize, shared-expert gate): the ids
// and weights the expert kernels of moe.cu read from device memory. Needs the prelude and
// reduce.cuh; compiled in the "moe" module after moe.cu.

// Benchmark-only (REDLITE_BENCH_ROUTE_SPREAD=1 builds the kernels with REDLITE_ROUTE_SPREAD):
// a token's chosen experts all rotated by one hash of its router logits, so that routing
// spreads uniformly over the experts — the worst case of an expert cache, which the random
// weights of a synthetic file do not give (they route most tokens to a few experts). Still
// `used` distinct experts per token and the same weights; not the model's output.
#ifndef REDLITE_ROUTE_SPREAD
#define REDLITE_ROUTE_SPREAD 0
#endif
static __device__ __forceinline__ int route_spread(int id, const float* row, int n_expert) {
    if (!REDLITE_ROUTE_SPREAD || id < 0 || id >= n_expert) return id;
    u32 h = __float_as_uint(row[0]) * 0x9e3779b1u ^ __float_as_uint(row[1]) * 0x85ebca6bu;
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return int((u32(id) + h) % u32(n_expert));
}

// Benchmark-only (REDLITE_BENCH_ROUTE_SKEW=<decay>, see route_skew.rs and docs/CUDA.md): a
// token's `used` chosen experts replaced by `used` distinct experts drawn from a fixed
// popularity law, the router's weights kept in their places; not the model's output. Expert
// rank x·n_expert (x in [0, 1), rank 0 the hottest) has density ∝ exp(-x / decay), drawn by
// inverting its CDF: x = -decay · ln(1 - u · (1 - exp(-1 / decay))). Ranks become experts
// through the layer's permutation (stride · rank + offset) mod n_expert, stride coprime to
// n_expert, so each layer has other hot experts. The random stream starts from a hash of the
// token's router logits and the layer's seed: the same logits give the same experts. A
// drawn rank already taken is drawn again (64 tries), then the next free rank is taken.
// One thread per token; ids `[tokens][used]`, logits `[tokens][n_expert]`.
#define ROUTE_SKEW_THREADS 128
#define ROUTE_SKEW_TRIES 64

static __device__ __forceinline__ u32 route_skew_mix(u32 z) {
    z ^= z >> 16;
    z *= 0x85ebca6bu;
    z ^= z >> 13;
    z *= 0xc2b2ae35u;
    return z ^ (z >> 16);
}

__global__ void __launch_bounds__(ROUTE_SKEW_THREADS)
moe_route_skew_kernel(const float* __restrict__ logits, int* __restrict__ ids, int tokens,
                      int n_expert, int used, u32 seed, u32 stride, u32 offset, float decay) {
    pdl_begin();
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* l = logits + i64(t) * n_expert;
    int* chosen = ids + i64(t) * used;
    u32 state = route_skew_mix(seed ^ __float_as_uint(l[0]) * 0x9e3779b1u);
    state = route_skew_mix(state ^ __float_as_uint(l[1 % n_expert]) * 0x85ebca6bu);
    state = route_skew_mix(state ^ __float_as_uint(l[n_expert - 1]) * 0x2c1b3c6du);
    const float mass = 1.0f - expf(-1.0f / decay);
    const auto expert_of = [&](int rank) {
        return int((u64(stride) * u64(rank) + offset) % u64(n_expert));
    };
    const auto taken = [&](int e, int k) {
        for (int j = 0; j < k; ++j) {
            if (chosen[j] == e) return true;
        }
        return false;
    };
    for (int k = 0; k < used; ++k) {
        int rank = 0;
        for (int attempt = 0; attempt < ROUTE_SKEW_TRIES; ++attempt) {
            state += 0x9e3779b9u;
            const float u = float(route_skew_mix(state) >> 8) * (1.0f / 16777216.0f);
            const float x = -decay * logf(1.0f - u * mass);
            rank = min(int(x * float(n_expert)), n_expert - 1);
            if (!taken(expert_of(rank), k)) break;
        }
        while (taken(expert_of(rank), k)) rank = (rank + 1) % n_expert;
        chosen[k] = expert_of(rank);
    }
}

// The warp's largest (v, index), ties to the lower index; every lane ends with it. Two
// warp-wide integer reductions (sm_80+) instead of five rounds of two shuffles: the same
// choice for the values routing compares (no NaN, no -0; an index ≥ 0).
static __device__ __forceinline__ void warp_argmax(float& v, int& index) {
    const u32 key = float_order_key(v);
    const u32 best = __reduce_max_sync(0xffffffffu, key);
    index = int(__reduce_min_sync(0xffffffffu, key == best ? u32(index) : 0xffffffffu));
    v = float_of_order_key(best);
}

// One CTA per token. p = softmax(logits[t]); the `used` largest p (ties to the lower
// index) in descending order; weights = p / Σ_top p; shared_weight = sigmoid(shared_logit).
// Dynamic shared memory: n_expert floats.
__global__ void moe_route_kernel(const float* __restrict__ logits,
                                 const float* __restrict__ shared_logit, int* __restrict__ ids,
                                 float* __restrict__ weights, float* __restrict__ shared_weight,
                                 int n_expert, int used) {
    pdl_begin();
    extern __shared__ float p[];
    __shared__ float scratch[32];
    __shared__ float best_value[32];
    __shared__ int best_index[32];
    __shared__ float chosen_value;
    __shared__ int chosen_index;
    const int t = blockIdx.x;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    const float* l = logits + i64(t) * n_expert;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) m = fmaxf(m, l[i]);
    m = block_reduce_max(m, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
        p[i] = expf(l[i] - m);
        sum += p[i];
    }
    sum = block_reduce_sum(sum, scratch);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) p[i] *= inv;
    __syncthreads();
    float total = 0.0f;
    for (int k = 0; k < used; ++k) {
        float v = -1.0f;
        int index = n_expert;
        for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
            if (p[i] > v) {
                v = p[i];
                index = i;
            }
        }
        warp_argmax(v, index);
        if (lane == 0) {
            best_value[warp] = v;
            best_index[warp] = index;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float bv = best_value[0];
            int bi = best_index[0];
            for (int w = 1; w < warps; ++w) {
                if (best_value[w] > bv || (best_value[w] == bv && best_index[w] < bi)) {
                    bv = best_value[w];
                    bi = best_index[w];
                }
            }
            chosen_value = bv;
            chosen_index = bi;
            ids[t * used + k] = route_spread(bi, logits + i64(t) * n_expert, n_expert);
            weights[t * used + k] = bv;
            if (bi < n_expert) p[bi] = -1.0f;  // NaN logits select nothing valid
        }
        __syncthreads();
        total += chosen_value;
        __syncthreads();
    }
    for (int k = threadIdx.x; k < used; k += blockDim.x) weights[t * used + k] /= total;
    if (threadIdx.x == 0) shared_weight[t] = sigmoidf(shared_logit[t]);
}

// The softmax of one token's logits across the warp: this lane's e^(l - max) into p (0 for
// padding) and the reciprocal of their sum, summed in warp order.
template <int PER>
static __device__ __forceinline__ float route_exps(const float* l, int n_expert, int lane,
                                                   float (&p)[PER]) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = lane + WARP_SIZE * j;
        p[j] = i < n_expert ? l[i] : -INFINITY;
        m = fmaxf(m, p[j]);
    }
    m = warp_reduce_max(m);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        p[j] = lane + WARP_SIZE * j < n_expert ? expf(p[j] - m) : 0.0f;
        sum += p[j];
    }
    return 1.0f / warp_reduce_sum(sum);
}

// Version 2 of the routing (the default; REDLITE_ROUTE_V1=1 keeps the kernel above): one
// warp per token, no block barrier, and p in registers (PER per lane: n_expert ≤ 32 PER).
// The same selection (largest p first, ties to the lower index); the softmax sums run in
// warp order. Lane k keeps the k-th choice until the end. One token's routing by one warp:
// `l` its n_expert logits, `ids` / `weights` its `used` outputs.
// The caller writes the shared expert's weight.
template <int PER>
static __device__ __forceinline__ void route_token_v2(const float* l, int* ids, float* weights,
                                                      int n_expert, int used, int lane) {
    float p[PER];
    const float inv = route_exps<PER>(l, n_expert, lane, p);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        // Padding and chosen entries hold -2, below every probability and the -1 start.
        p[j] = lane + WARP_SIZE * j < n_expert ? p[j] * inv : -2.0f;
    }
    float total = 0.0f, mine = 0.0f;
    int mine_index = n_expert;
    for (int k = 0; k < used; ++k) {
        float v = -1.0f;
        int index = n_expert;
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            if (p[j] > v) {
                v = p[j];
                index = lane + WARP_SIZE * j;
            }
        }
        warp_argmax(v, index);
        if (lane == k % WARP_SIZE) {
            mine = v;
            mine_index = index;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            if (lane + WARP_SIZE * j == index) p[j] = -2.0f;
        }
        total += v;
        if (k % WARP_SIZE == WARP_SIZE - 1 || k == used - 1) {
            // Lanes flush their choices every 32 picks (used > 32 is allowed).
            const int slot = k - k % WARP_SIZE + lane;
            if (slot <= k) {
                ids[slot] = route_spread(mine_index, l, n_expert);
                weights[slot] = mine;
            }
        }
    }
    __syncwarp();
    for (int k = lane; k < used; k += WARP_SIZE) weights[k] /= total;
}

// route_token_v2's selection in shorter chains (what the routing kernels run; route_token_v2
// stays for more than 32 picks and as the host emulator's reference), the same ids and
// weights bit for bit. A round's per-lane choice is a
// tree of pairwise picks (4 levels instead of a chain of PER compares: each pick keeps the
// larger value, the lower j on a tie, so the root is the first largest as the chain finds
// it), and with at most 32 picks each lane's pick is divided by the total in registers
// (route_token_v2 stores it, then reads it back from global memory to divide).
template <int PER>
static __device__ __forceinline__ void route_token_tree(const float* l, int* ids, float* weights,
                                                        int n_expert, int used, int lane) {
    static_assert((PER & (PER - 1)) == 0, "a tree of pairwise picks over PER values");
    if (used > WARP_SIZE) {
        route_token_v2<PER>(l, ids, weights, n_expert, used, lane);
        return;
    }
    float p[PER];
    const float inv = route_exps<PER>(l, n_expert, lane, p);
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        // Padding and chosen entries hold -2, below every probability and the -1 start. A
        // NaN, which the chain never picks (NaN > v is false), becomes -2 too: never picked.
        const float q = p[j] * inv;
        p[j] = lane + WARP_SIZE * j < n_expert && q == q ? q : -2.0f;
    }
    float total = 0.0f, mine = 0.0f;
    int mine_index = n_expert;
    for (int k = 0; k < used; ++k) {
        float tv[PER];
        int tj[PER];
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            tv[j] = p[j];
            tj[j] = j;
        }
#pragma unroll
        for (int s = 1; s < PER; s *= 2) {
#pragma unroll
            for (int j = 0; j < PER; j += 2 * s) {
                // tv[j] covers j ... j + s - 1, tv[j + s] the s after: the left one stays
                // unless strictly smaller.
                const bool right = tv[j + s] > tv[j];
                tv[j] = right ? tv[j + s] : tv[j];
                tj[j] = right ? tj[j + s] : tj[j];
            }
        }
        // The chain starts from (-1, n_expert) and takes only values above it.
        float v = tv[0] > -1.0f ? tv[0] : -1.0f;
        int index = tv[0] > -1.0f ? lane + WARP_SIZE * tj[0] : n_expert;
        warp_argmax(v, index);
        if (lane == k) {
            mine = v;
            mine_index = index;
        }
#pragma unroll
        for (int j = 0; j < PER; ++j) {
            if (lane + WARP_SIZE * j == index) p[j] = -2.0f;
        }
        total += v;
    }
    if (lane < used) {
        ids[lane] = route_spread(mine_index, l, n_expert);
        weights[lane] = mine / total;
    }
}

template <int PER>
__global__ void moe_route_v2_kernel(const float* __restrict__ logits,
                                    const float* __restrict__ shared_logit,
                                    int* __restrict__ ids, float* __restrict__ weights,
                                    float* __restrict__ shared_weight, int n_expert, int used) {
    pdl_begin();
    const int t = blockIdx.x;
    route_token_tree<PER>(logits + i64(t) * n_expert, ids + i64(t) * used,
                          weights + i64(t) * used, n_expert, used, threadIdx.x);
    if (threadIdx.x == 0) shared_weight[t] = sigmoidf(shared_logit[t]);
}

// moe_route_v2_kernel with the shared expert's gate row (`gate_w`, one row of `cols` values
// in blocks B) in the same launch, so that its dot runs beside the routing instead of as a
// one-CTA launch before it. One CTA of 1 + SPLIT_WARPS warps per token, of which two work:
// warp 0 routes after the wait; warp 1 computes, before the wait (under PDL while the router
// still runs: x is the router's input, so its writer finished before the router passed its own
// wait, and the row is a weight), the parts of all SPLIT_WARPS x 32 lanes of
// matmul_splitk_kernel<B, SPLIT_WARPS>'s dot (lane l of round r as its thread 32 r + l) and each
// round's butterfly, which are its warp sums, then after the wait adds them as its
// block_reduce_sum does (the lanes past the rounds add zeros) and writes the shared expert's
// weight: the logit's bits are those of the split-K launch (host emulator case `router`, GPU
// test `routing`). The routing warp meets no barrier (thirty-eighth session, with the norms'
// and attention's orders: +1.1 %). The other warps leave at once.
template <int PER, class B, int SPLIT_WARPS>
__global__ void __launch_bounds__((1 + SPLIT_WARPS) * WARP_SIZE)
moe_route_gate_kernel(const float* __restrict__ logits, const u8* __restrict__ gate_w,
                      const float* __restrict__ x, int* __restrict__ ids,
                      float* __restrict__ weights, float* __restrict__ shared_weight, int cols,
                      int n_expert, int used) {
    PROBE_RETURN(PROBE_ROUTE);
    B::prepare();
    const int t = blockIdx.x, warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    if (warp > 1) return;
    if (warp == 1) {
        float part[SPLIT_WARPS];
#pragma unroll
        for (int r = 0; r < SPLIT_WARPS; ++r) {
            part[r] = row_dot_lane<B, SPLIT_WARPS * WARP_SIZE>(gate_w, x + i64(t) * cols, cols,
                                                                r * WARP_SIZE + lane);
        }
        float mine = 0.0f;
#pragma unroll
        for (int r = 0; r < SPLIT_WARPS; ++r) {
            const float sum = warp_reduce_sum(part[r]);
            if (lane == r) mine = sum;
        }
        pdl_begin();
        const float logit = warp_reduce_sum(mine);
        if (lane == 0) shared_weight[t] = sigmoidf(logit);
        return;
    }
    pdl_begin();
    route_token_tree<PER>(logits + i64(t) * n_expert, ids + i64(t) * used,
                          weights + i64(t) * used, n_expert, used, lane);
}

// A fused router CTA's end: its row's logit written, a ticket taken; whether it is the last
// CTA to finish (which then sees every CTA's logit). A barrier for the whole CTA.
static __device__ __forceinline__ bool last_router_cta(float* logits, int row, float sum,
                                                       int* ticket) {
    __shared__ bool last;
    if (threadIdx.x == 0) {
        logits[row] = sum;
        __threadfence();
        last = atomicAdd(ticket, 1) == int(gridDim.x) - 1;
    }
    __syncthreads();
    if (!last) return false;
    __threadfence();
    return true;
}

// The last fused router CTA's routing: the n_expert + 1 logits into shared memory `l`, the
// ticket reset for the next launch, then moe_route_v2_kernel's routing of the one token and
// the shared expert's weight.
template <int PER>
static __device__ __forceinline__ void route_in_last_cta(const float* logits, float* l,
                                                         int* ticket, int* ids, float* weights,
                                                         float* shared_weight, int n_expert,
                                                         int used) {
    for (int i = threadIdx.x; i <= n_expert; i += blockDim.x) l[i] = __ldcg(logits + i);
    __syncthreads();
    if (threadIdx.x == 0) *ticket = 0;
    if (threadIdx.x < WARP_SIZE) {
        route_token_tree<PER>(l, ids, weights, n_expert, used, threadIdx.x);
    }
    if (threadIdx.x == 0) *shared_weight = sigmoidf(l[n_expert]);
}

// One decode token's router and routing in one launch (`REDLITE_ROUTER_TOPK=0`: the
// router's split-K matmul, then the routing). `w`: the F32 router's n_expert rows, then the
// shared expert's gate row (stored after them). Grid n_expert + 1 CTAs of WARPS warps, CTA r
// reducing row r as matmul_splitk_kernel<F32x4, WARPS> does (same lanes, same order) into
// logits[r]. Under PDL each CTA asks L2 for its row before the wait, as the split-K matmul
// does. The last CTA to finish (a ticket counter that it resets for the next launch) copies
// the logits to shared memory and its first warp routes as moe_route_v2_kernel does: the same
// bits as the split-K launch and the routing.
template <int PER, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
router_topk_kernel(const u8* __restrict__ w, const float* __restrict__ x,
                   float* __restrict__ logits, int* __restrict__ ticket, int* __restrict__ ids,
                   float* __restrict__ weights, float* __restrict__ shared_weight, int cols,
                   int n_expert, int used) {
    __shared__ float scratch[32];
    __shared__ float l[32 * PER + 1];
    const int row = blockIdx.x;
    const i64 row_bytes = i64(cols / F32x4::VALUES) * F32x4::BYTES;
    const u8* r = w + row * row_bytes;
#if REDLITE_PDL
    // The row asked of L2 while the previous kernel still runs.
    prefetch_l2(r, row_bytes, threadIdx.x, WARPS * WARP_SIZE);
#endif
    pdl_begin();
    const float part = row_dot_lane<F32x4, WARPS * WARP_SIZE>(r, x, cols, threadIdx.x);
    const float sum = block_reduce_sum(part, scratch);
    if (!last_router_cta(logits, row, sum, ticket)) return;
    route_in_last_cta<PER>(logits, l, ticket, ids, weights, shared_weight, n_expert, used);
}
