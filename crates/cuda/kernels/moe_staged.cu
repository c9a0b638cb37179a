// The expert down + weighted sum of one-token steps with each term's weight rows copied to
// shared memory before the PDL wait (`REDLITE_DOWN_STAGED=4|8`: CTAs of that many warps;
// resident experts under PDL only). Needs moe.cu (quantize_down_input) and q8dot.cuh.
//
// Why: moe_down_q8_preload_kernel holds every term's items in registers across its wait (128
// registers, 8 warps: 32K registers a CTA). While the expert gate/up before it runs, a
// multiprocessor holds 5 or 6 of its CTAs (72 registers x 128 threads each) and has 10-19K
// registers free, so no down CTA can start there until gate/up CTAs leave: the loads meant
// to overlap the gate/up start at its end. Here the bytes go to shared memory through
// cp.async, which holds no register, and a lane loads a term's items from there after the
// wait, GROUP terms at a time.
//
// A CTA's ROWS rows of an expert are ROWS * row_bytes consecutive bytes, copied in 16-byte
// chunks; the host takes this kernel only where every such slab and its source are 16-byte
// aligned, `rows` is a multiple of ROWS and there are at most DOWN_STAGED_TERMS terms.
// Shared memory: the input's Q8_K staging (q8_shared_bytes), then a slab per routed term
// (used of them), then the shared expert's. The sums are moe_down_q8_preload_kernel's: the
// same items, D::dot on the same Raws, terms in selection order: the same bits.
#define DOWN_STAGED_TERMS 16
#ifndef REDLITE_DOWN_STAGED_GROUP
#define REDLITE_DOWN_STAGED_GROUP 4
#endif

template <class B, int WARPS, int LANES, int IPL>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_q8_staged_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                          const float* __restrict__ weights, const float* __restrict__ act,
                          float* __restrict__ out, int rows, int ff, int used, int n_expert,
                          int accumulate, const u8* __restrict__ shared_down,
                          const float* __restrict__ shared_weight,
                          const float* __restrict__ act_shared, int shared_ff) {
    PROBE_RETURN(PROBE_DOWN);
    typedef Q8Dot<B> D;
    constexpr int ROWS = WARPS * (WARP_SIZE / LANES);
    constexpr int THREADS = WARPS * WARP_SIZE;
    constexpr int GROUP = REDLITE_DOWN_STAGED_GROUP;
    const bool fixed = (REDLITE_PROBE_EXIT & PROBE_FIXED_EXPERTS) != 0;
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int t = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int local = warp * (WARP_SIZE / LANES) + lane / LANES;
    const int row0 = blockIdx.x * ROWS;
    const int row_bytes = ff / B::VALUES * B::BYTES;
    const int shared_row_bytes = shared_ff / B::VALUES * B::BYTES;
    const int slab = ROWS * row_bytes;
    const bool with_shared = shared_down != nullptr;
    const int terms = used + (with_shared ? 1 : 0);
    const int values = used * ff + (with_shared ? shared_ff : 0);
    u8* slabs = reinterpret_cast<u8*>(q8_shared) + q8_scales_bytes(values) + values;
    // The ids all loaded before any is used (one L2 round trip), through L2: this SM's L1
    // may hold the previous layer's.
    const int* id = ids + t * used;
    int expert[DOWN_STAGED_TERMS];
#pragma unroll
    for (int k = 0; k < DOWN_STAGED_TERMS; ++k) {
        expert[k] = k >= used ? -1 : fixed ? k : __ldcg(id + k);
    }
    if (!fixed && expert[0] == SKIP_PAIR) {
        pdl_begin();
        return;
    }
    // Term k's chunk c is copied by thread (k * slab / 16 + c) % THREADS: the copies spread
    // evenly over the CTA whatever the slab's size. `live` keeps bit k for a valid routed term.
    unsigned live = 0;
#pragma unroll
    for (int k = 0; k < DOWN_STAGED_TERMS; ++k) {
        if (k >= terms) break;
        const bool shared = k == used;
        const i64 e = expert[k];
        const bool valid = e >= 0 && e < n_expert;
        live |= unsigned(valid) << k;
        if (!shared && !valid) continue;
        const u8* src = shared ? shared_down + i64(row0) * shared_row_bytes
                               : down + (e * rows + row0) * row_bytes;
        const int chunks = (shared ? ROWS * shared_row_bytes : slab) / 16;
        const int first = (int(threadIdx.x) - (k * slab / 16) % THREADS + THREADS) % THREADS;
        u8* dst = slabs + k * slab;
        for (int c = first; c < chunks; c += THREADS) cp_async16(dst + 16 * c, src + 16 * c);
    }
    pdl_begin();
    float* ad;
    i8* aq;
    quantize_down_input(q8_shared, act, act_shared, t, used, ff, with_shared ? shared_ff : 0,
                        ad, aq);
    cp_async_wait_all();
    __syncthreads();
    const int row = row0 + local;
    if (row >= rows) return;
    const int blocks = ff / B::VALUES;
    const int per_expert = ff / B::VALUES * B::ITEMS;
    const int per_shared = shared_ff / B::VALUES * B::ITEMS;
    const int routed = used * ff;
    float partial = 0.0f;
#pragma unroll 1
    for (int k0 = 0; k0 < terms; k0 += GROUP) {
        typename D::Raw raw[GROUP][IPL];
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const int k = k0 + g;
            const bool shared = k == used;
            if (k >= terms || (!shared && ((live >> k) & 1u) == 0)) continue;
            const u8* w = slabs + k * slab + local * (shared ? shared_row_bytes : row_bytes);
            const int n = shared ? per_shared : per_expert;
#pragma unroll
            for (int j = 0; j < IPL; ++j) {
                const int i = member + LANES * j;
                if (i < n) raw[g][j] = D::load(w + (i / B::ITEMS) * B::BYTES, i % B::ITEMS);
            }
        }
#pragma unroll
        for (int g = 0; g < GROUP; ++g) {
            const int k = k0 + g;
            if (k >= terms) break;
            const bool shared = k == used;
            if (!shared && ((live >> k) & 1u) == 0) continue;
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
