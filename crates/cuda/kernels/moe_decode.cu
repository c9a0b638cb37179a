// The q8 expert matvecs of moe.cu with the weights loaded ahead (the default for one row
// per lane group; `REDLITE_PRELOAD=0` keeps moe_gate_up_q8_kernel / moe_down_q8_kernel).
// A decode step's expert kernels were latency chains: each lane loaded an item, waited,
// computed, then loaded the next (the down kernel walks 10 + 1 experts one after the other,
// 12 % occupancy and no eligible warp 64 % of cycles on the H200). Here each lane first
// issues the loads of many items (`Q8Dot::load`: the bits only, no arithmetic on them),
// then quantizes the input while they are in flight, then computes. Every sum runs in the
// order of the kernel it stands for, by the same operations: the same bits. Needs moe.cu
// (SKIP_PAIR and the skip tests) and q8dot.cuh before it.

// Gate/up: one row per lane group (moe_gate_up_q8_kernel with ROWS = 1); BATCH items of
// the gate row and of the up row loaded at a time.
template <class B, int WARPS, int LANES>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_q8_preload_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                              const int* __restrict__ ids, const float* __restrict__ x,
                              float* __restrict__ act, int ff, int cols, int used,
                              int n_expert, const u8* __restrict__ shared_gate,
                              const u8* __restrict__ shared_up, float* __restrict__ act_shared,
                              int shared_ff) {
    typedef Q8Dot<B> D;
    constexpr int BATCH = D::PRELOAD / 2 > 0 ? D::PRELOAD / 2 : 1;
    if (skipped_pair(ids, blockIdx.z, blockIdx.y, used)) return;
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int k = blockIdx.y, t = blockIdx.z;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row = (blockIdx.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* g_row;
    const u8* u_row;
    float* out;
    int n_rows;
    bool valid = true;
    if (k == used) {
        n_rows = shared_ff;
        g_row = shared_gate + i64(row) * row_bytes;
        u_row = shared_up + i64(row) * row_bytes;
        out = act_shared + i64(t) * shared_ff + row;
    } else {
        n_rows = ff;
        const i64 expert = ids[t * used + k];
        valid = expert >= 0 && expert < n_expert;
        const i64 at = ((valid ? expert : 0) * ff + row) * row_bytes;
        g_row = gate + at;
        u_row = up + at;
        out = act + (i64(t) * used + k) * ff + row;
    }
    const int items = cols / B::VALUES * B::ITEMS;
    typename D::Raw g_raw[BATCH], u_raw[BATCH];
    const auto load_batch = [&](int base) {
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int i = member + LANES * (base + j);
            if (i < items) {
                const i64 offset = i64(i / B::ITEMS) * B::BYTES;
                g_raw[j] = D::load(g_row + offset, i % B::ITEMS);
                u_raw[j] = D::load(u_row + offset, i % B::ITEMS);
            }
        }
    };
    if (valid && row < n_rows) load_batch(0);
    float* xd = reinterpret_cast<float*>(q8_shared);
    i8* xq = reinterpret_cast<i8*>(q8_shared) + q8_scales_bytes(cols);
    quantize_q8k_shared(x + i64(t) * cols, cols, nullptr, 0, xd, xq);
    if (row >= n_rows) return;
    if (!valid) {
        if (member == 0) *out = 0.0f;
        return;
    }
    float g = 0.0f, u = 0.0f;
    const int per_lane = (items + LANES - 1) / LANES;
    for (int base = 0; base < per_lane; base += BATCH) {
        if (base > 0) load_batch(base);
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int i = member + LANES * (base + j);
            if (i >= items) break;
            const int block = i / B::ITEMS, item = i % B::ITEMS;
            const i8* qb = xq + block * B::VALUES;
            const float db = xd[block];
            g += D::dot(g_raw[j], item, qb, db);
            u += D::dot(u_raw[j], item, qb, db);
        }
    }
    const float gs = group_reduce_sum<LANES>(g), us = group_reduce_sum<LANES>(u);
    if (member == 0) *out = siluf(gs) * us;
}

// Down + weighted sum: one row per lane group (moe_down_q8_kernel with ROWS = 1). A term is
// a selected expert or the shared one (k = used); each lane holds at most IPL items of a
// term's row, and TERMS terms' items are loaded at a time (all 10 + 1 at once for the
// IQ2_XXS experts of the 80B model).
template <class B, int WARPS, int LANES, int IPL>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_q8_preload_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                           const float* __restrict__ weights, const float* __restrict__ act,
                           float* __restrict__ out, int rows, int ff, int used, int n_expert,
                           int accumulate, const u8* __restrict__ shared_down,
                           const float* __restrict__ shared_weight,
                           const float* __restrict__ act_shared, int shared_ff) {
    typedef Q8Dot<B> D;
    constexpr int TERMS = D::PRELOAD / IPL > 0 ? D::PRELOAD / IPL : 1;
    if (skipped_token(ids, blockIdx.y, used)) return;
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int t = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row = (blockIdx.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES;
    const i64 row_bytes = i64(ff / B::VALUES) * B::BYTES;
    const i64 shared_row_bytes = i64(shared_ff / B::VALUES) * B::BYTES;
    const int* id = ids + t * used;
    const int terms = used + (shared_down != nullptr ? 1 : 0);
    const int per_expert = ff / B::VALUES * B::ITEMS;
    const int per_shared = shared_ff / B::VALUES * B::ITEMS;
    // Term k's row, or null for an expert id out of range (no term).
    const auto term_row = [&](int k) -> const u8* {
        if (k == used) return shared_down + i64(row) * shared_row_bytes;
        const i64 expert = id[k];
        return expert >= 0 && expert < n_expert ? down + (expert * rows + row) * row_bytes
                                                : nullptr;
    };
    typename D::Raw raw[TERMS][IPL];
    const auto load_terms = [&](int k0) {
#pragma unroll
        for (int g = 0; g < TERMS; ++g) {
            const int k = k0 + g;
            const u8* w = k < terms ? term_row(k) : nullptr;
            if (w == nullptr) continue;
            const int n = k == used ? per_shared : per_expert;
#pragma unroll
            for (int j = 0; j < IPL; ++j) {
                const int i = member + LANES * j;
                if (i < n) raw[g][j] = D::load(w + i64(i / B::ITEMS) * B::BYTES, i % B::ITEMS);
            }
        }
    };
    if (row < rows) load_terms(0);
    const int routed = used * ff;
    const int staged = routed + (shared_down != nullptr ? shared_ff : 0);
    float* ad = reinterpret_cast<float*>(q8_shared);
    i8* aq = reinterpret_cast<i8*>(q8_shared) + q8_scales_bytes(staged);
    quantize_q8k_shared(act + i64(t) * routed, routed,
                        shared_down != nullptr ? act_shared + i64(t) * shared_ff : nullptr,
                        staged - routed, ad, aq);
    if (row >= rows) return;
    const int blocks = ff / B::VALUES;
    float partial = 0.0f;
    for (int k0 = 0; k0 < terms; k0 += TERMS) {
        if (k0 > 0) load_terms(k0);
#pragma unroll
        for (int g = 0; g < TERMS; ++g) {
            const int k = k0 + g;
            if (k >= terms) break;
            const bool shared = k == used;
            if (!shared && (id[k] < 0 || id[k] >= n_expert)) continue;
            const int n = shared ? per_shared : per_expert;
            const i8* q = shared ? aq + routed : aq + k * ff;
            const float* d = shared ? ad + used * blocks : ad + k * blocks;
            float acc = 0.0f;
#pragma unroll
            for (int j = 0; j < IPL; ++j) {
                const int i = member + LANES * j;
                if (i >= n) break;
                const int block = i / B::ITEMS;
                acc += D::dot(raw[g][j], i % B::ITEMS, q + block * B::VALUES, d[block]);
            }
            partial += (shared ? shared_weight[t] : weights[t * used + k]) * acc;
        }
    }
    const float total = group_reduce_sum<LANES>(partial);
    if (member == 0) {
        float* o = out + i64(t) * rows + row;
        *o = (accumulate ? *o : 0.0f) + total;
    }
}
