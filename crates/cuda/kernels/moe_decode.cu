// The one-token q8 expert down + weighted sum: moe_down_q8_kernel (a lane group's rows
// loaded as it goes; `REDLITE_MOE_DOWN_PRELOAD=0`, and the rows a lane group other than one)
// and moe_down_q8_preload_kernel (the default for one row per lane group). The first is a
// latency chain per lane: it loads an item of the first selected expert, waits, computes,
// then loads the next expert's (10 + 1 one after the other; 12 % occupancy and no eligible
// warp 64 % of cycles on the H200). The second has each lane first issue the loads of all its
// terms' items (`Q8Dot::load`: the bits only, no arithmetic on them), then quantize the input
// while they are in flight, then compute. The sum runs in moe_down_q8_kernel's order by the
// same operations: the same bits. Measured on the H200 (IQ2_XXS experts of the 80B model):
// 12.8 -> 11.5 us a launch. The same scheme for the dense and gate/up matvecs, whose lanes
// hold 2-4 items, was slower (10.0 -> 11.1 and 13.3 -> 15.1 us) and was removed. Needs
// moe.cu (the skip tests) and q8dot.cuh before it.

// The down kernels' input of token t quantized into shared memory `staging`: the `used`
// SwiGLU rows of act (ff values each), then the shared expert's (shared_ff values; 0 when
// none). `ad` gets the block scales, `aq` the codes (the routed ones first). Ends with a
// CTA barrier.
static __device__ __forceinline__ void quantize_down_input(float4* staging,
                                                           const float* __restrict__ act,
                                                           const float* __restrict__ act_shared,
                                                           int t, int used, int ff,
                                                           int shared_ff, float*& ad, i8*& aq) {
    const int routed = used * ff;
    ad = reinterpret_cast<float*>(staging);
    aq = reinterpret_cast<i8*>(staging) + q8_scales_bytes(routed + shared_ff);
    quantize_q8k_shared(act + i64(t) * routed, routed,
                        shared_ff > 0 ? act_shared + i64(t) * shared_ff : nullptr, shared_ff,
                        ad, aq);
}

template <class B, int WARPS, int LANES, int ROWS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_q8_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                   const float* __restrict__ weights, const float* __restrict__ act,
                   float* __restrict__ out, int rows, int ff, int used, int n_expert,
                   int accumulate, const u8* __restrict__ shared_down,
                   const float* __restrict__ shared_weight, const float* __restrict__ act_shared,
                   int shared_ff) {
    pdl_begin();
    if (skipped_token(ids, blockIdx.y, used)) return;
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int t = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % LANES;
    const int row0 = ((blockIdx.x * WARPS + warp) * (WARP_SIZE / LANES) + lane / LANES) * ROWS;
    const int rows_here = min(ROWS, rows - row0);
    const i64 row_bytes = i64(ff / B::VALUES) * B::BYTES;
    const i64 shared_row_bytes = i64(shared_ff / B::VALUES) * B::BYTES;
    const int* id = ids + t * used;
    const int terms = used + (shared_down != nullptr ? 1 : 0);
    if (rows_here > 0) {
        for (int k = member; k < terms; k += LANES) {
            if (k == used) {
                prefetch_l2(shared_down + i64(row0) * shared_row_bytes,
                            rows_here * shared_row_bytes, 0, 1);
            } else if (id[k] >= 0 && id[k] < n_expert) {
                prefetch_l2(down + (i64(id[k]) * rows + row0) * row_bytes, rows_here * row_bytes,
                            0, 1);
            }
        }
    }
    const int routed = used * ff;
    float* ad;
    i8* aq;
    quantize_down_input(q8_shared, act, act_shared, t, used, ff,
                        shared_down != nullptr ? shared_ff : 0, ad, aq);
    if (rows_here <= 0) return;
    const int blocks = ff / B::VALUES;
    float partial[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) partial[r] = 0.0f;
    for (int k = 0; k < used; ++k) {
        const i64 expert = id[k];
        if (expert < 0 || expert >= n_expert) continue;
        const u8* w = down + (expert * rows + row0) * row_bytes;
        const float weight = weights[t * used + k];
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < rows_here) {
                partial[r] += weight * row_dot_lane_q8<B, LANES>(w + r * row_bytes, aq + k * ff,
                                                                 ad + k * blocks, ff, member);
            }
        }
    }
    if (shared_down != nullptr) {
        const u8* w = shared_down + i64(row0) * shared_row_bytes;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < rows_here) {
                partial[r] += shared_weight[t] *
                              row_dot_lane_q8<B, LANES>(w + r * shared_row_bytes, aq + routed,
                                                        ad + used * blocks, shared_ff, member);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float total = group_reduce_sum<LANES>(partial[r]);
        if (member == 0 && r < rows_here) {
            float* o = out + i64(t) * rows + row0 + r;
            *o = (accumulate ? *o : 0.0f) + total;
        }
    }
}

// Down + weighted sum: one row per lane group (moe_down_q8_kernel with ROWS = 1). A term is
// a selected expert or the shared one (k = used); each lane holds at most IPL items of a
// term's row, and TERMS terms' items are loaded at a time (all 10 + 1 at once for the
// IQ2_XXS experts of the 80B model).
// FOLD (1 or 2): each thread does the work of FOLD lanes of the group, lanes m and
// m + LANES / FOLD, and adds their two partials itself before the shuffles, as the first step
// of group_reduce_sum<LANES> (offset LANES / 2) adds them: the same terms, sums and bits with
// half the threads, TERMS halved to keep the registers. A batch of 3 or 4 tokens (an MTP
// verification) asks 384 or 512 CTAs of 8 warps at 128 registers, where an H100 holds 264:
// two waves; folded, one.
// EARLY (resident experts, under PDL): the ids and the first terms' weights are loaded
// before `pdl_begin`, while the gate/up launch before this one still runs. The ids were
// written by the routing two launches back, and nothing of the step writes resident experts'
// bytes; with a cache the gate/up launch copies the missing experts' down rows, so a cached
// layer's launch is not EARLY. The ids are read through L2 (`__ldcg`): this SM's L1 may hold
// the previous layer's.
template <class B, int WARPS, int LANES, int IPL, bool EARLY, int FOLD = 1>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
moe_down_q8_preload_kernel(const u8* __restrict__ down, const int* __restrict__ ids,
                           const float* __restrict__ weights, const float* __restrict__ act,
                           float* __restrict__ out, int rows, int ff, int used, int n_expert,
                           int accumulate, const u8* __restrict__ shared_down,
                           const float* __restrict__ shared_weight,
                           const float* __restrict__ act_shared, int shared_ff) {
    PROBE_RETURN(PROBE_DOWN);
    typedef Q8Dot<B> D;
    static_assert(FOLD == 1 || FOLD == 2, "a thread does one lane's work or two");
    constexpr int TERMS = D::PRELOAD / (IPL * FOLD) > 0 ? D::PRELOAD / (IPL * FOLD) : 1;
    // Threads a row; thread `member` does lanes member + PHYS * v, v < FOLD.
    constexpr int PHYS = LANES / FOLD;
    const bool fixed = (REDLITE_PROBE_EXIT & PROBE_FIXED_EXPERTS) != 0;
    if constexpr (!EARLY) {
        pdl_begin();
        if (!fixed && skipped_token(ids, blockIdx.y, used)) return;
    }
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const int t = blockIdx.y;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int member = lane % PHYS;
    const int row = (blockIdx.x * WARPS + warp) * (WARP_SIZE / PHYS) + lane / PHYS;
    const i64 row_bytes = i64(ff / B::VALUES) * B::BYTES;
    const i64 shared_row_bytes = i64(shared_ff / B::VALUES) * B::BYTES;
    const int* id = ids + t * used;
    const int terms = used + (shared_down != nullptr ? 1 : 0);
    const int per_expert = ff / B::VALUES * B::ITEMS;
    const int per_shared = shared_ff / B::VALUES * B::ITEMS;
    // Terms k0 .. k0 + TERMS - 1: their expert ids are loaded all before any is used (one L2
    // round trip for the group; loaded in the loop that used them, each id's load was waited
    // on before the next was issued, its range check branching: 10 round trips in a row, 29 %
    // of the kernel's warp stall samples on the H100), then each valid term's items. `live`
    // keeps bit g for a valid term k0 + g (the dot loop's check under EARLY).
    unsigned live = 0;
    int first_id = -1;
    typename D::Raw raw[TERMS][FOLD][IPL];
    const auto load_terms = [&](int k0, bool items) {
        int expert[TERMS];
#pragma unroll
        for (int g = 0; g < TERMS; ++g) {
            const int k = k0 + g;
            expert[g] = k >= used ? -1 : fixed ? k : EARLY ? __ldcg(id + k) : id[k];
        }
        first_id = expert[0];
        live = 0;
#pragma unroll
        for (int g = 0; g < TERMS; ++g) {
            const int k = k0 + g;
            const i64 e = expert[g];
            live |= unsigned(e >= 0 && e < n_expert) << g;
            if (!items || k >= terms) continue;
            const u8* w = k == used ? shared_down + i64(row) * shared_row_bytes
                          : e >= 0 && e < n_expert ? down + (e * rows + row) * row_bytes
                                                   : nullptr;
            if (w == nullptr) continue;
            const int n = k == used ? per_shared : per_expert;
#pragma unroll
            for (int v = 0; v < FOLD; ++v) {
#pragma unroll
                for (int j = 0; j < IPL; ++j) {
                    const int i = member + PHYS * v + LANES * j;
                    if (i < n) {
                        raw[g][v][j] = D::load(w + i64(i / B::ITEMS) * B::BYTES, i % B::ITEMS);
                    }
                }
            }
        }
    };
    load_terms(0, row < rows);
    // EARLY: a skipped token (its first id SKIP_PAIR) is seen in the group's ids.
    if (EARLY && !fixed && first_id == SKIP_PAIR) {
        pdl_begin();
        return;
    }
    if (EARLY) pdl_begin();
    const int routed = used * ff;
    float* ad;
    i8* aq;
    if ((REDLITE_PROBE_EXIT & PROBE_DOWN_INPUT) != 0) {
        // Zero scales (whatever codes): the down's sums are zeros. Garbage scales made NaN
        // sums, NaN router logits in the next block and no expert chosen there at all, so the
        // thirteenth session's first figure for this probe was not the prologue's cost.
        const int values = routed + (shared_down != nullptr ? shared_ff : 0);
        ad = reinterpret_cast<float*>(q8_shared);
        aq = reinterpret_cast<i8*>(q8_shared) + q8_scales_bytes(values);
        for (int b = threadIdx.x; b < values / Q8K_VALUES; b += blockDim.x) ad[b] = 0.0f;
        __syncthreads();
    } else {
        quantize_down_input(q8_shared, act, act_shared, t, used, ff,
                            shared_down != nullptr ? shared_ff : 0, ad, aq);
    }
    if (row >= rows) return;
    const int blocks = ff / B::VALUES;
    float partial[FOLD];
#pragma unroll
    for (int v = 0; v < FOLD; ++v) partial[v] = 0.0f;
    for (int k0 = 0; k0 < terms; k0 += TERMS) {
        if (k0 > 0) load_terms(k0, true);
#pragma unroll
        for (int g = 0; g < TERMS; ++g) {
            const int k = k0 + g;
            if (k >= terms) break;
            const bool shared = k == used;
            // EARLY read the ids through L2 only: their bits in `live`, not a second round
            // trip. Otherwise id[k] is in L1, and `live` would take the register that keeps
            // the IPL = 2 instances off the stack on sm_80.
            const bool valid = EARLY ? ((live >> g) & 1u) != 0
                                     : fixed || (id[k] >= 0 && id[k] < n_expert);
            if (!shared && !valid) continue;
            const int n = shared ? per_shared : per_expert;
            const i8* q = shared ? aq + routed : aq + k * ff;
            const float* d = shared ? ad + used * blocks : ad + k * blocks;
            const float scale = shared ? shared_weight[t] : weights[t * used + k];
#pragma unroll
            for (int v = 0; v < FOLD; ++v) {
                float acc = 0.0f;
#pragma unroll
                for (int j = 0; j < IPL; ++j) {
                    const int i = member + PHYS * v + LANES * j;
                    if (i >= n) break;
                    const int block = i / B::ITEMS;
                    acc += D::dot(raw[g][v][j], i % B::ITEMS, q + block * B::VALUES, d[block]);
                }
                partial[v] += scale * acc;
            }
        }
    }
    // Folded: lanes member and member + PHYS added here, as the shuffle at offset LANES / 2
    // would add them; then the rest of the tree.
    const float total =
        group_reduce_sum<PHYS>(FOLD == 2 ? partial[0] + partial[FOLD - 1] : partial[0]);
    if (member == 0) {
        float* o = out + i64(t) * rows + row;
        *o = (accumulate ? *o : 0.0f) + total;
    }
}
