// One decode token's expert gate/up on an expert cache, with the cache's copies in the same
// launch (issue 8): the experts already in their slots compute while the missing ones come
// over PCIe. Before, the fill kernel copied every miss (gate, up and down) and only then
// did the gate/up launch start, so a layer paid its copies and all of its products one
// after the other.
//
// The launch is three kinds of CTA, told apart by a ticket (an atomic counter taken at
// the start, so the order is the order CTAs actually started in, not blockIdx order):
//   1. the misses' gate and up copies, `chunk` bytes a CTA (expert_copy.cuh); each
//      counts its fill's chunks done in `ready[fill]` once its bytes are written, and the
//      one completing the last fill adds the time since the lookup to `stats[4]` (how long
//      the missing experts' products waited: the copies the cached ones did not hide);
//   2. moe_gate_up_q8_kernel's CTAs (the same body, so the same bits); one whose pair's slot
//      is being filled waits until `ready` says every gate and up chunk of that fill is in;
//   3. the misses' down copies (needed only by the down launch after this one).
// A CTA of kind 2 only waits for CTAs with lower tickets, which have all started and wait
// for nothing, so the wait always ends (the argument of decoupled look-back scans). The CTA
// with the last ticket resets the counter for the next launch; the lookup zeroes `ready`.
// Needs expert_copy.cuh (copy_expert_chunk) and moe.cu (moe_gate_up_q8_body) before it.

// Ticket of this CTA (the same value in every thread); the last one resets the counter.
static __device__ __forceinline__ u32 take_ticket(u32* ticket, u32 total) {
    __shared__ u32 mine;
    if (threadIdx.x == 0) {
        mine = atomicAdd(ticket, 1u);
        if (mine == total - 1) *ticket = 0;
    }
    __syncthreads();
    return mine;
}

// The fill (index into `fills`) copying the expert of `slot`, or -1 when it is a hit.
static __device__ __forceinline__ int fill_of_slot(const int* fills, int count, int slot) {
    for (int f = 0; f < count; ++f) {
        if (fills[2 * f + 1] == slot) return f;
    }
    return -1;
}

// Grid: (gate/up copy CTAs + gate/up CTAs + down copy CTAs) in x, where the gate/up CTAs
// are moe_gate_up_q8_kernel's grid (`grid_x`, `grid_y`, one token) flattened. The copies'
// arguments are expert_cache_fill_kernel's: `fills` (expert, slot pairs), `*fill_count` of
// them, at most `max_fills`; the host copies; the down slot stack (gate and up are the
// products' stacks); each expert's gate (= up) and down bytes; `chunk` bytes a CTA, so
// `gate_chunks` and `down_chunks` CTAs a tensor; `ticket`, `ready[max_fills + 1]` and the
// layer's `stats` as above.
template <class B, int WARPS, int LANES, int ROWS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_gate_up_q8_cached_kernel(u8* gate, u8* up, const int* __restrict__ ids,
                             const float* __restrict__ x, const float* __restrict__ gd,
                             const i8* __restrict__ gq, float* __restrict__ act, int ff,
                             int cols, int used, int n_expert, const u8* __restrict__ shared_gate,
                             const u8* __restrict__ shared_up, float* __restrict__ act_shared,
                             int shared_ff, const int* __restrict__ fills,
                             const int* __restrict__ fill_count, const u8* host_gate,
                             const u8* host_up, const u8* host_down, u8* down, i64 gate_bytes,
                             i64 down_bytes, i64 chunk, int wide, int max_fills, int gate_chunks,
                             int down_chunks, u32* ticket, u32* ready,
                             u64* stats, int grid_x, int grid_y) {
    pdl_begin();
    // The slot stacks are written by the copy CTAs and read by the product CTAs (never the
    // same bytes before a CTA has waited for them), hence no __restrict__ on them.
    const int gate_up_copies = max_fills * 2 * gate_chunks;
    const int products = grid_x * grid_y;
    const u32 total = u32(gate_up_copies + products + max_fills * down_chunks);
    const int id = int(take_ticket(ticket, total));
    const int count = *fill_count;
    if (id < gate_up_copies) {
        const int fill = id / (2 * gate_chunks), tensor = id / gate_chunks % 2;
        if (fill >= count) return;
        const i64 expert = fills[2 * fill], slot = fills[2 * fill + 1];
        const u8* src = (tensor == 0 ? host_gate : host_up) + expert * gate_bytes;
        u8* dst = (tensor == 0 ? gate : up) + slot * gate_bytes;
        copy_expert_chunk(src, dst, gate_bytes, i64(id % gate_chunks) * chunk, chunk,
                          wide);
        // Every thread's stores, then one release of the chunk.
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            const bool filled = atomicAdd(&ready[fill], 1u) + 1 == u32(2 * gate_chunks);
            // ready[max_fills] counts the fills complete.
            if (filled && atomicAdd(&ready[max_fills], 1u) + 1 == u32(count)) {
                atomicAdd(&stats[4], global_ns() - stats[5]);
            }
        }
        return;
    }
    if (id >= gate_up_copies + products) {
        const int at = id - gate_up_copies - products;
        const int fill = at / down_chunks;
        if (fill >= count) return;
        const i64 expert = fills[2 * fill], slot = fills[2 * fill + 1];
        copy_expert_chunk(host_down + expert * down_bytes, down + slot * down_bytes,
                          down_bytes, i64(at % down_chunks) * chunk, chunk, wide);
        return;
    }
    const int p = id - gate_up_copies;
    const uint3 cta = make_uint3(p % grid_x, p / grid_x % grid_y, p / products);
    // The shared expert (k == used) and skipped pairs read no slot.
    const int k = int(cta.y);
    const int slot = k < used ? ids[i64(cta.z) * used + k] : -1;
    const int fill = slot >= 0 ? fill_of_slot(fills, count, slot) : -1;
    if (fill >= 0) {
        if (threadIdx.x == 0) {
            const volatile u32* done = ready + fill;
            while (*done < u32(2 * gate_chunks)) __nanosleep(256);
            __threadfence();
        }
        __syncthreads();
    }
    moe_gate_up_q8_body<B, WARPS, LANES, ROWS, false>(cta, gate, up, ids, x, gd, gq, act, ff,
                                                      cols, used, n_expert, shared_gate,
                                                      shared_up, act_shared, shared_ff);
}
