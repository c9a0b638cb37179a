// The MoE block: gate/up matvecs with SwiGLU fused, and the down matvec with the weighted
// sum over the selected experts fused (the routing is in moe_route.cu, the same module).
// Expert ids are read from device memory: no host round trip. Needs the prelude and
// reduce.cuh.

// A (token, slot) pair that the caller leaves out of a launch (an expert cache's other
// waves): nothing is computed or written for it. Distinct from an id out of range (-1 and
// others), whose products are written as zeros.
#define SKIP_PAIR (-2)

// Gate/up launches: pair (t, k) is skipped (k == used is the shared expert: never).
static __device__ __forceinline__ bool skipped_pair(const int* ids, int t, int k, int used) {
    return k < used && ids[i64(t) * used + k] == SKIP_PAIR;
}

// Down launches: token t is skipped when its first pair is (a launch per pair has used = 1).
static __device__ __forceinline__ bool skipped_token(const int* ids, int t, int used) {
    return ids[i64(t) * used] == SKIP_PAIR;
}

// act[t][k][r] = silu(gate_e[r] · x[t]) * (up_e[r] · x[t]) with e = ids[t][k]; gate and up
// are stacks of n_expert experts of `ff` rows each (an id out of range yields 0). Grid (ceil(ff / WARPS), used, tokens); one warp
// per row; x[t] staged in dynamic shared memory (cols floats).
template <class B, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                   const int* __restrict__ ids, const float* __restrict__ x,
                   float* __restrict__ act, int ff, int cols, int used, int n_expert) {
    pdl_begin();
    if (skipped_pair(ids, blockIdx.z, blockIdx.y, used)) return;
    B::prepare();
    extern __shared__ float xs[];
    const int k = blockIdx.y, t = blockIdx.z;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = x[i64(t) * cols + i];
    __syncthreads();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= ff) return;
    const i64 expert = ids[t * used + k];
    if (expert < 0 || expert >= n_expert) {
        if (lane == 0) act[(i64(t) * used + k) * ff + row] = 0.0f;
        return;
    }
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const i64 at = (expert * ff + row) * row_bytes;
    const float g = warp_reduce_sum(row_dot_lane<B>(gate + at, xs, cols, lane));
    const float u = warp_reduce_sum(row_dot_lane<B>(up + at, xs, cols, lane));
    if (lane == 0) act[(i64(t) * used + k) * ff + row] = siluf(g) * u;
}

// out[t][r] = (accumulate ? out[t][r] : 0) + Σ_k weights[t][k] · (down_e[r] · act[t][k])
// with e = ids[t][k]; down is a stack of experts of `rows` rows of `ff` values. Grid
// (ceil(rows / WARPS), tokens); act[t] (used * ff floats) staged in dynamic shared memory.
template <class B, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                const float* __restrict__ weights, const float* __restrict__ act,
                float* __restrict__ out, int rows, int ff, int used, int n_expert,
                int accumulate) {
    pdl_begin();
    if (skipped_token(ids, blockIdx.y, used)) return;
    B::prepare();
    extern __shared__ float as[];
    const int t = blockIdx.y;
    for (int i = threadIdx.x; i < used * ff; i += blockDim.x) as[i] = act[i64(t) * used * ff + i];
    __syncthreads();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= rows) return;
    const i64 row_bytes = i64(ff / B::VALUES) * B::BYTES;
    float total = 0.0f;
    for (int k = 0; k < used; ++k) {
        const i64 expert = ids[t * used + k];
        if (expert < 0 || expert >= n_expert) continue;
        const u8* w = down + (expert * rows + row) * row_bytes;
        const float d = warp_reduce_sum(row_dot_lane<B>(w, as + k * ff, ff, lane));
        total += weights[t * used + k] * d;
    }
    if (lane == 0) {
        float* o = out + i64(t) * rows + row;
        *o = (accumulate ? *o : 0.0f) + total;
    }
}

// Version 2 of the two expert matvecs (the default; version 1 above stays for A/B through
// REDLITE_MATVEC_V1=1). LANES lanes (16 or 32) share a row, so a warp covers 32 / LANES
// rows and short rows (ff = 512 of IQ2_XXS: 16 items) leave no lane idle. Same grid shape
// as version 1 but ceil(rows / (WARPS * 32 / LANES)) CTAs along x.

// Gate and up rows decoded in one loop and reduced together (their loads overlap).
template <class B, int WARPS, int LANES>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_v2_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                      const int* __restrict__ ids, const float* __restrict__ x,
                      float* __restrict__ act, int ff, int cols, int used, int n_expert) {
    pdl_begin();
    if (skipped_pair(ids, blockIdx.z, blockIdx.y, used)) return;
    B::prepare();
    extern __shared__ float xs[];
    const int k = blockIdx.y, t = blockIdx.z;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) xs[i] = x[i64(t) * cols + i];
    __syncthreads();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row = (blockIdx.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES;
    const i64 expert = ids[t * used + k];
    float* out = act + (i64(t) * used + k) * ff + row;
    if (expert < 0 || expert >= n_expert) {
        if (member == 0 && row < ff) *out = 0.0f;
        return;
    }
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const i64 at = (expert * ff + min(row, ff - 1)) * row_bytes;
    const int items = cols / B::VALUES * B::ITEMS;
    float g = 0.0f, u = 0.0f;
    for (int i = member; i < items; i += LANES) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const float* xb = xs + block * B::VALUES;
        const i64 offset = at + i64(block) * B::BYTES;
        B::decode(gate + offset, item, [&](int index, float value) { g = fmaf(value, xb[index], g); });
        B::decode(up + offset, item, [&](int index, float value) { u = fmaf(value, xb[index], u); });
    }
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1) {
        g += __shfl_xor_sync(0xffffffffu, g, offset);
        u += __shfl_xor_sync(0xffffffffu, u, offset);
    }
    if (member == 0 && row < ff) *out = siluf(g) * u;
}

// The routing weight scales each lane's partial before the one reduction per row (version 1
// reduces once per expert): the sum runs in another order.
template <class B, int WARPS, int LANES>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_v2_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                   const float* __restrict__ weights, const float* __restrict__ act,
                   float* __restrict__ out, int rows, int ff, int used, int n_expert,
                   int accumulate) {
    pdl_begin();
    if (skipped_token(ids, blockIdx.y, used)) return;
    B::prepare();
    extern __shared__ float as[];
    const int t = blockIdx.y;
    for (int i = threadIdx.x; i < used * ff; i += blockDim.x) as[i] = act[i64(t) * used * ff + i];
    __syncthreads();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row = (blockIdx.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES;
    const i64 row_bytes = i64(ff / B::VALUES) * B::BYTES;
    const i64 clamped = min(row, rows - 1);
    float partial = 0.0f;
    for (int k = 0; k < used; ++k) {
        const i64 expert = ids[t * used + k];
        if (expert < 0 || expert >= n_expert) continue;
        const u8* w = down + (expert * rows + clamped) * row_bytes;
        partial += weights[t * used + k] * row_dot_lane<B, LANES>(w, as + k * ff, ff, member);
    }
    const float total = group_reduce_sum<LANES>(partial);
    if (member == 0 && row < rows) {
        float* o = out + i64(t) * rows + row;
        *o = (accumulate ? *o : 0.0f) + total;
    }
}

// Version 3 of the two expert matvecs (REDLITE_MOE_V3=1; version 2 stays the default).
// Nothing is staged in shared memory: a CTA's few rows read x (or act) through L1, meant to
// cost less than copying all of it per CTA and waiting on a barrier. Measured on the H200 it
// costs more (one 4-byte L1 load per value instead of a shared-memory load): kept for A/B
// and for the shared-expert folding below. WARPS warps per CTA, WARPS rows per CTA.

// Both take the shared expert too when its matrices are given (non-null `s*` pointers, same
// block type and row length as the routed ones): gate/up as slot k = used of grid.y into
// act_shared [T][shared_ff], down as more items of the same sum, weighted by
// shared_weight[t]. That saves the shared expert's two launches.

// Gate and up: one warp per row (the 32 lanes take the row's items, gate and up decoded in
// one loop), as version 2 with 32 lanes.
template <class B, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_v3_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                      const int* __restrict__ ids, const float* __restrict__ x,
                      float* __restrict__ act, int ff, int cols, int used, int n_expert,
                      const u8* __restrict__ shared_gate, const u8* __restrict__ shared_up,
                      float* __restrict__ act_shared, int shared_ff) {
    pdl_begin();
    if (skipped_pair(ids, blockIdx.z, blockIdx.y, used)) return;
    B::prepare();
    const int k = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* g_rows;
    const u8* u_rows;
    float* out;
    if (k == used) {
        if (row >= shared_ff) return;
        g_rows = shared_gate + row * row_bytes;
        u_rows = shared_up + row * row_bytes;
        out = act_shared + i64(t) * shared_ff + row;
    } else {
        if (row >= ff) return;
        const i64 expert = ids[t * used + k];
        out = act + (i64(t) * used + k) * ff + row;
        if (expert < 0 || expert >= n_expert) {
            if (lane == 0) *out = 0.0f;
            return;
        }
        g_rows = gate + (expert * ff + row) * row_bytes;
        u_rows = up + (expert * ff + row) * row_bytes;
    }
    const float* xs = x + i64(t) * cols;
    const int items = cols / B::VALUES * B::ITEMS;
    float g = 0.0f, u = 0.0f;
#pragma unroll 2
    for (int i = lane; i < items; i += WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const float* xb = xs + block * B::VALUES;
        const i64 offset = i64(block) * B::BYTES;
        B::decode(g_rows + offset, item, [&](int index, float value) { g = fmaf(value, xb[index], g); });
        B::decode(u_rows + offset, item, [&](int index, float value) { u = fmaf(value, xb[index], u); });
    }
    g = warp_reduce_sum(g);
    u = warp_reduce_sum(u);
    if (lane == 0) *out = siluf(g) * u;
}

// Down + weighted sum: one warp per output row; its lanes take the (expert, item) pairs of
// all `used` experts together (for ff = 512 of IQ2_XXS: 10 x 16 items, 5 per lane), so the
// loads of every selected expert's row are in flight at once instead of one expert after
// the other. Each product is scaled by its expert's weight before the one warp reduction.
template <class B, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_v3_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                   const float* __restrict__ weights, const float* __restrict__ act,
                   float* __restrict__ out, int rows, int ff, int used, int n_expert,
                   int accumulate, const u8* __restrict__ shared_down,
                   const float* __restrict__ shared_weight, const float* __restrict__ act_shared,
                   int shared_ff) {
    pdl_begin();
    if (skipped_token(ids, blockIdx.y, used)) return;
    B::prepare();
    const int t = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= rows) return;
    const i64 row_bytes = i64(ff / B::VALUES) * B::BYTES;
    const int per_expert = ff / B::VALUES * B::ITEMS;
    const int routed = used * per_expert;
    const int total = routed + (shared_down != nullptr ? shared_ff / B::VALUES * B::ITEMS : 0);
    const int* id = ids + t * used;
    const float* weight = weights + t * used;
    const float* a = act + i64(t) * used * ff;
    float acc = 0.0f;
#pragma unroll 4
    for (int i = lane; i < total; i += WARP_SIZE) {
        const u8* w;
        const float* xb;
        float scale;
        if (i < routed) {
            const int k = i / per_expert, it = i % per_expert;
            const i64 expert = id[k];
            if (expert < 0 || expert >= n_expert) continue;
            const int block = it / B::ITEMS;
            xb = a + k * ff + block * B::VALUES;
            w = down + (expert * rows + row) * row_bytes + i64(block) * B::BYTES;
            scale = weight[k];
        } else {
            const int block = (i - routed) / B::ITEMS;
            const i64 shared_row_bytes = i64(shared_ff / B::VALUES) * B::BYTES;
            xb = act_shared + i64(t) * shared_ff + block * B::VALUES;
            w = shared_down + row * shared_row_bytes + i64(block) * B::BYTES;
            scale = shared_weight[t];
        }
        const int item = (i < routed ? i % per_expert : i - routed) % B::ITEMS;
        float part = 0.0f;
        B::decode(w, item, [&](int index, float value) { part = fmaf(value, xb[index], part); });
        acc = fmaf(scale, part, acc);
    }
    const float sum = warp_reduce_sum(acc);
    if (lane == 0) {
        float* o = out + i64(t) * rows + row;
        *o = (accumulate ? *o : 0.0f) + sum;
    }
}

// Version q8 of the two expert matvecs (the default for the types of q8dot.cuh under the
// backend's `Precision::Ggml`): version 2's layout, the input quantized to Q8_K into
// shared memory by each CTA (x[t]: cols values; act[t]: used x ff values, each expert's
// ff a whole number of 256-value blocks; gate/up may read x quantized from `gd`, `gq`
// instead: `q8_input`) and integer block dots. Each lane first asks L2
// for its rows so the weight loads overlap the quantization prologue. The shared expert
// rides along as version 3's does (non-null `shared_*`, same block type and row length):
// gate/up as slot k = used of grid.y into act_shared, down as one more weighted term.

// The work of CTA `cta` (its blockIdx in moe_gate_up_q8_kernel's grid); moe_cached.cu runs
// the same body from a ticket, so both give the same bits.
// AHEAD_LOADS: the loads-ahead items of q8dot.cuh where REDLITE_Q8_LOADS_AHEAD is on (the
// cache's kernel passes false: with its copy CTAs' code beside, the extra registers spilled
// on sm_80); the same sums either way. PREPARED: the caller copied the codebooks already
// (`q8_prepare`, before its PDL wait).
template <class B, int WARPS, int LANES, int ROWS, bool AHEAD_LOADS = true, bool PREPARED = false>
static __device__ __forceinline__ void moe_gate_up_q8_body(
    uint3 cta, const u8* __restrict__ gate, const u8* __restrict__ up,
    const int* __restrict__ ids, const float* __restrict__ x, const float* __restrict__ gd,
    const i8* __restrict__ gq, float* __restrict__ act, int ff, int cols, int used,
    int n_expert, const u8* __restrict__ shared_gate, const u8* __restrict__ shared_up,
    float* __restrict__ act_shared, int shared_ff) {
    const bool fixed = (REDLITE_PROBE_EXIT & PROBE_FIXED_EXPERTS) != 0;
    const int k = cta.y, t = cta.z;
    // The pair's expert id, loaded once for the skip check and the rows (`skipped_pair`'s
    // test; the compiler reloaded it behind the branch).
    const int id = k < used ? ids[i64(t) * used + k] : 0;
    if (!fixed && k < used && id == SKIP_PAIR) return;
    if constexpr (!PREPARED) q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    // This lane group's ROWS consecutive rows.
    const int row0 = ((cta.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES) * ROWS;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* g_rows;
    const u8* u_rows;
    float* out;
    int n_rows;
    bool valid = true;
    if (k == used) {
        n_rows = shared_ff;
        g_rows = shared_gate + i64(row0) * row_bytes;
        u_rows = shared_up + i64(row0) * row_bytes;
        out = act_shared + i64(t) * shared_ff + row0;
    } else {
        n_rows = ff;
        const i64 expert = fixed ? k : id;
        valid = expert >= 0 && expert < n_expert;
        const i64 at = ((valid ? expert : 0) * ff + row0) * row_bytes;
        g_rows = gate + at;
        u_rows = up + at;
        out = act + (i64(t) * used + k) * ff + row0;
    }
    const int rows_here = min(ROWS, n_rows - row0);
    if (valid && rows_here > 0 && prefetch_before_input(gq)) {
        prefetch_l2(g_rows, rows_here * row_bytes, member, LANES);
        prefetch_l2(u_rows, rows_here * row_bytes, member, LANES);
    }
    const float* xd;
    const i8* xq;
    q8_input(x, gd, gq, t, 1, cols, q8_shared, xd, xq);
    if (rows_here <= 0) return;
    if (!valid) {
        if (member < rows_here) out[member] = 0.0f;
        return;
    }
    const int items = cols / B::VALUES * B::ITEMS;
    float g[ROWS], u[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) g[r] = u[r] = 0.0f;
    int first = member;
#if REDLITE_Q8_LOADS_AHEAD
    // As matmul_q8_kernel: the lane's first items of every row of both matrices loaded
    // before any is used, then summed in the loop's order.
    {
        constexpr int AHEAD =
            AHEAD_LOADS ? Q8Ahead<typename Q8Dot<B>::Raw>::of(Q8Dot<B>::PRELOAD, 2 * ROWS) : 0;
        if constexpr (AHEAD > 0) {
            typename Q8Dot<B>::Raw graw[AHEAD][ROWS], uraw[AHEAD][ROWS];
#pragma unroll
            for (int p = 0; p < AHEAD; ++p) {
                const int i = member + p * LANES;
                const i64 offset = i64(i / B::ITEMS) * B::BYTES;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if (i < items && r < rows_here) {
                        graw[p][r] = Q8Dot<B>::load(g_rows + r * row_bytes + offset, i % B::ITEMS);
                        uraw[p][r] = Q8Dot<B>::load(u_rows + r * row_bytes + offset, i % B::ITEMS);
                    }
                }
            }
#pragma unroll
            for (int p = 0; p < AHEAD; ++p) {
                const int i = member + p * LANES;
                if (i < items) {
                    const int block = i / B::ITEMS, item = i % B::ITEMS;
                    const i8* qb = xq + block * B::VALUES;
                    const float db = xd[block];
#pragma unroll
                    for (int r = 0; r < ROWS; ++r) {
                        if (r < rows_here) {
                            g[r] += Q8Dot<B>::dot(graw[p][r], item, qb, db);
                            u[r] += Q8Dot<B>::dot(uraw[p][r], item, qb, db);
                        }
                    }
                }
            }
            first = member + AHEAD * LANES;
        }
    }
#endif
    for (int i = first; i < items; i += LANES) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const i8* qb = xq + block * B::VALUES;
        const float db = xd[block];
        const i64 offset = i64(block) * B::BYTES;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < rows_here) {
                g[r] += Q8Dot<B>::dot(g_rows + r * row_bytes + offset, item, qb, db);
                u[r] += Q8Dot<B>::dot(u_rows + r * row_bytes + offset, item, qb, db);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float gs = group_reduce_sum<LANES>(g[r]), us = group_reduce_sum<LANES>(u[r]);
        if (member == 0 && r < rows_here) out[r] = siluf(gs) * us;
    }
}

// CTAs a multiprocessor must hold at once (ptxas keeps the registers to that; 0: the
// compiler's choice, which an explicit 1 is not). A one-token step's 704 gate/up CTAs (10
// routed experts and the shared one, 64 CTAs each) are one wave on a 132-multiprocessor GPU
// only at 6 CTAs a multiprocessor (80 registers a thread); IQ1_M's items loaded ahead, two
// rows a lane group, took 88 (5 a multiprocessor: 660 resident, a second wave of 44). The
// others keep the compiler's choice (IQ2_XXS: 72, 7 a multiprocessor); IQ1_M's four-row
// variant would spill at 80. Registers only: the same instructions' results, the same bits.
// REDLITE_GATE_UP_BATCH_BLOCKS (a compile option, default 0) asks the `moe_batch` module's
// gate/up (batches of 2-16 tokens) for that many CTAs a multiprocessor: an A/B of the
// 4-row verification's occupancy (IQ2_XXS: 7 at the compiler's 72 registers, 8 at 64).
#ifndef REDLITE_MOE_BATCH
#define REDLITE_MOE_BATCH 0
#endif
#ifndef REDLITE_GATE_UP_BATCH_BLOCKS
#define REDLITE_GATE_UP_BATCH_BLOCKS 0
#endif
template <class B, int ROWS>
struct GateUpMinBlocks {
    static constexpr int value = REDLITE_MOE_BATCH ? REDLITE_GATE_UP_BATCH_BLOCKS : 0;
};
template <>
struct GateUpMinBlocks<IQ1M, 2> {
    static constexpr int value = 6;
};

template <class B, int WARPS, int LANES, int ROWS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE, GateUpMinBlocks<B, ROWS>::value)
moe_gate_up_q8_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                      const int* __restrict__ ids, const float* __restrict__ x,
                      const float* __restrict__ gd, const i8* __restrict__ gq,
                      float* __restrict__ act, int ff, int cols, int used, int n_expert,
                      const u8* __restrict__ shared_gate, const u8* __restrict__ shared_up,
                      float* __restrict__ act_shared, int shared_ff) {
    // The codebooks are constant: copied before the wait, while the routing still runs (the
    // CTAs resident early under PDL), not between the ids and the weight loads. The same bits.
    q8_prepare<B>();
    pdl_begin();
    PROBE_RETURN(PROBE_GATE_UP);
    moe_gate_up_q8_body<B, WARPS, LANES, ROWS, true, true>(
        blockIdx, gate, up, ids, x, gd, gq, act, ff, cols, used, n_expert, shared_gate, shared_up,
        act_shared, shared_ff);
}

// Grouped gate/up for prompts (several tokens per call): the (token, slot) pairs routed to
// one expert gathered into tiles of up to NT pairs on the host, from the router's ids.
// `tile_expert[y]` is tile y's expert, or -1 for the shared expert; `tile_pairs[y * NT + j]`
// its pairs t * used + k (for the shared expert: tokens t), packed first, -1 after. Grid
// (row groups, tiles): each CTA quantizes its pairs' x into shared memory (all their blocks
// spread over the warps at once) and each lane group takes one row of the expert for all the
// pairs, so a weight item is loaded and decoded once for up to NT products instead of once
// per pair. Per (pair, row) the terms, the lanes and their order are moe_gate_up_q8_kernel's
// with ROWS = 1 (the default): the same bits.
template <class B, int WARPS, int LANES, int NT>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_q8_grouped_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                              const int* __restrict__ tile_expert,
                              const int* __restrict__ tile_pairs, const float* __restrict__ x,
                              float* __restrict__ act, int ff, int cols, int used,
                              const u8* __restrict__ shared_gate,
                              const u8* __restrict__ shared_up, float* __restrict__ act_shared,
                              int shared_ff) {
    pdl_begin();
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int expert = tile_expert[blockIdx.y];
    const int* pairs = tile_pairs + i64(blockIdx.y) * NT;
    const bool shared_tile = expert < 0;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row = (blockIdx.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES;
    const int n_rows = shared_tile ? shared_ff : ff;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* g_row = (shared_tile ? shared_gate : gate + i64(expert) * ff * row_bytes) +
                      i64(row) * row_bytes;
    const u8* u_row = (shared_tile ? shared_up : up + i64(expert) * ff * row_bytes) +
                      i64(row) * row_bytes;
    if (row < n_rows) {
        prefetch_l2(g_row, row_bytes, member, LANES);
        prefetch_l2(u_row, row_bytes, member, LANES);
    }
    int nt = 0;
#pragma unroll
    for (int j = 0; j < NT; ++j) nt += pairs[j] >= 0 ? 1 : 0;
    const int nb = cols / Q8K_VALUES;
    float* xd = reinterpret_cast<float*>(q8_shared);
    i8* xq = reinterpret_cast<i8*>(q8_shared) + q8_scales_bytes(NT * cols);
    quantize_q8k_blocks(
        [=](int b) {
            const int pair = pairs[b / nb];
            const int token = shared_tile ? pair : pair / used;
            return x + i64(token) * cols + i64(b % nb) * Q8K_VALUES;
        },
        nt * nb, xd, xq);
    if (row >= n_rows) return;
    const int items = cols / B::VALUES * B::ITEMS;
    float g[NT], u[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) g[j] = u[j] = 0.0f;
    for (int i = member; i < items; i += LANES) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const i64 offset = i64(block) * B::BYTES;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (j < nt) {
                const i8* qb = xq + j * cols + block * B::VALUES;
                const float db = xd[j * nb + block];
                g[j] += Q8Dot<B>::dot(g_row + offset, item, qb, db);
                u[j] += Q8Dot<B>::dot(u_row + offset, item, qb, db);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float gs = group_reduce_sum<LANES>(g[j]), us = group_reduce_sum<LANES>(u[j]);
        if (member == 0 && j < nt) {
            float* out = shared_tile ? act_shared + i64(pairs[j]) * shared_ff
                                     : act + i64(pairs[j]) * ff;
            out[row] = siluf(gs) * us;
        }
    }
}

// out[t] = sum over k of weights[t][k] * y[t][k] (k in order, from 0): the routed experts'
// down products of a prompt, computed per pair (`y`: [tokens][used][rows]) by launches that
// may each cover some of the pairs, summed in one fixed order, so the result does not depend
// on how the pairs were split. Grid (ceil(rows / blockDim), tokens).
__global__ void moe_combine_kernel(const float* __restrict__ y, const float* __restrict__ weights,
                                   float* __restrict__ out, int rows, int used) {
    pdl_begin();
    const int t = blockIdx.y;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows) return;
    float total = 0.0f;
    for (int k = 0; k < used; ++k) {
        total += weights[i64(t) * used + k] * y[(i64(t) * used + k) * rows + i];
    }
    out[i64(t) * rows + i] = total;
}
