// The q8 expert gate/up of a small batch (an MTP verification, a short prompt chunk) with the
// shared expert's rows read once for SHARED_TOKENS tokens. moe_gate_up_q8_kernel gives the
// shared expert one set of CTAs per token (slot k = used of grid.y, one grid.z per token),
// each reading the same rows: four tokens make 4 x 11 x 64 = 2,816 CTAs where 924 are resident
// on a 132-multiprocessor GPU (IQ2_XXS, 7 a multiprocessor), three waves and a tail of 44
// that lasts a full CTA. Here the shared slot's CTAs of grid.z = z take tokens z *
// SHARED_TOKENS onwards and those past the batch leave at once: 2,624 CTAs that work, three
// waves. The routed slots run moe_gate_up_q8_body unchanged. Needs moe.cu before it.
//
// Per (token, row) the items, the lanes, the order of the sum and the reduction are
// moe_gate_up_q8_body's (a Raw loaded once and dotted with each token's codes is the same
// `dot(load(...))`): the same bits as moe_gate_up_q8_kernel.
#define SHARED_TOKENS 4

// Tokens cta.z * TB .. (at most `tokens`) of the shared expert's gate/up into act_shared, x
// read quantized (gd, gq: `rms_norm_quantized` of the batch).
template <class B, int WARPS, int LANES, int ROWS, int TB>
static __device__ __forceinline__ void shared_gate_up_tokens(
    uint3 cta, const u8* __restrict__ shared_gate, const u8* __restrict__ shared_up,
    const float* __restrict__ gd, const i8* __restrict__ gq, float* __restrict__ act_shared,
    int shared_ff, int cols, int tokens) {
    const int t0 = int(cta.z) * TB;
    if (t0 >= tokens) return;
    const int count = min(TB, tokens - t0);
    q8_prepare<B>();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row0 = ((cta.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES) * ROWS;
    const int rows_here = min(ROWS, shared_ff - row0);
    if (rows_here <= 0) return;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* g_rows = shared_gate + i64(row0) * row_bytes;
    const u8* u_rows = shared_up + i64(row0) * row_bytes;
    const int items = cols / B::VALUES * B::ITEMS;
    const int scales = cols / Q8K_VALUES;
    float g[TB][ROWS], u[TB][ROWS];
#pragma unroll
    for (int j = 0; j < TB; ++j) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) g[j][r] = u[j][r] = 0.0f;
    }
    for (int i = member; i < items; i += LANES) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const i64 offset = i64(block) * B::BYTES;
        typename Q8Dot<B>::Raw graw[ROWS], uraw[ROWS];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < rows_here) {
                graw[r] = Q8Dot<B>::load(g_rows + r * row_bytes + offset, item);
                uraw[r] = Q8Dot<B>::load(u_rows + r * row_bytes + offset, item);
            }
        }
#pragma unroll
        for (int j = 0; j < TB; ++j) {
            if (j < count) {
                const i64 t = t0 + j;
                const i8* qb = gq + t * cols + block * B::VALUES;
                const float db = gd[t * scales + block];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if (r < rows_here) {
                        g[j][r] += Q8Dot<B>::dot(graw[r], item, qb, db);
                        u[j][r] += Q8Dot<B>::dot(uraw[r], item, qb, db);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int j = 0; j < TB; ++j) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float gs = group_reduce_sum<LANES>(g[j][r]);
            const float us = group_reduce_sum<LANES>(u[j][r]);
            if (member == 0 && j < count && r < rows_here) {
                act_shared[i64(t0 + j) * shared_ff + row0 + r] = siluf(gs) * us;
            }
        }
    }
}

// moe_gate_up_q8_kernel's arguments and grid (row groups, used + 1, tokens); the launcher
// passes the shared expert and x quantized (gq), which this kernel needs. Built for one and
// two rows a lane group (four tokens' sums of four rows spill), with the compiler's choice
// of registers: IQ1_M's cap of GateUpMinBlocks (80) spills here, and a batch's grid is
// several waves whatever the CTAs a multiprocessor holds.
template <class B, int WARPS, int LANES, int ROWS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_q8_batch_kernel(const u8* __restrict__ gate, const u8* __restrict__ up,
                            const int* __restrict__ ids, const float* __restrict__ x,
                            const float* __restrict__ gd, const i8* __restrict__ gq,
                            float* __restrict__ act, int ff, int cols, int used, int n_expert,
                            const u8* __restrict__ shared_gate, const u8* __restrict__ shared_up,
                            float* __restrict__ act_shared, int shared_ff) {
    pdl_begin();
    if (int(blockIdx.y) == used) {
        shared_gate_up_tokens<B, WARPS, LANES, ROWS, SHARED_TOKENS>(
            blockIdx, shared_gate, shared_up, gd, gq, act_shared, shared_ff, cols,
            int(gridDim.z));
        return;
    }
    moe_gate_up_q8_body<B, WARPS, LANES, ROWS>(blockIdx, gate, up, ids, x, gd, gq, act, ff,
                                               cols, used, n_expert, shared_gate, shared_up,
                                               act_shared, shared_ff);
}
