// The GPU expert cache of one MoE layer (issue 8): a fixed number of slots, each holding
// one expert's gate, up and down rows, and the tables that say which expert is where.
// Both kernels run on the device's stream between the router and the expert products, so
// a one-token decode step (lookup, copies, products) is still one CUDA graph: the host
// never waits for the router's choice.
//
// Tables (device memory, one set per layer):
//   slot_of[n_expert]  slot holding expert e, or -1
//   expert_of[slots]   expert in slot s, or -1 (empty)
//   stamp[slots]       the lookup call that last used slot s (0: never)
//   uses[n_expert]     LFU: the lookup calls that needed expert e (cached or not), halved
//                      at every `half_life`-th call
//   clock[1]           lookup calls so far
//   stats[8]           experts looked up that were hits, misses, lookup calls, lookups
//                      that needed more slots than the cache has (must stay 0: the host
//                      splits a batch so its experts fit), nanoseconds the products of
//                      missing experts waited for their copies (moe_cached.cu), when the
//                      last lookup ended (%globaltimer, the start of that wait), experts
//                      copied by prefetches, and hits on experts a prefetch brought in
//   prefetched[slots]  1 while slot s holds an expert a prefetch brought in and no lookup
//                      has used yet
//
// Replacement (`lfu` 0) is least recently used: the victims are the slots with the oldest
// stamps (ties: the lower slot). With `lfu` 1 it is least frequently used with aging: the
// slots whose experts have the fewest uses (ties: the oldest stamp, then the lower slot).
// The victims are taken in that order for the missing experts in increasing id order. A
// slot used by the current call is never a victim while the call's experts fit. The policy
// only picks slots: the expert products read the same bytes whichever slot holds them.
// Needs common.cuh and expert_copy.cuh before it.

#define CACHE_MAX_THREADS 1024
// Most victims the lookup picks by repeated minimum rather than by ranking every slot.
#define CACHE_PICK_BY_MINIMUM 8

// The warp's smallest (key, at) in that order; every lane ends with it.
static __device__ __forceinline__ void warp_min_key(u64& key, int& at) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        const u64 other = __shfl_xor_sync(0xffffffffu, key, offset);
        const int other_at = __shfl_xor_sync(0xffffffffu, at, offset);
        if (other < key || (other == key && other_at < at)) key = other, at = other_at;
    }
}

// One CTA of `blockDim.x` threads (a multiple of 32, at least n_expert and slots, at most
// 1024). `ids`: `pairs` expert ids (the router's choice; out-of-range ids are ignored and
// get slot -1, skipped pairs (-2) slot -2). Writes `slot_ids` (the slot of each pair's
// expert), `fills` (pairs of expert, slot to copy, in rank order) and `fill_count`, and
// zeroes `ready[ready_len + 1]`. `half_life` (LFU only) is at least 1.
// `prefetch` (1): the experts a later call is likely to need, brought in ahead (the next
// layer's router applied to this layer's input): the same slots and copies, but no counts
// of hits, misses or uses (the LFU's), and the slots it fills are marked prefetched.
__global__ void expert_cache_lookup_kernel(
    const int* __restrict__ ids, int pairs, int n_expert, int slots, int* __restrict__ slot_of,
    int* __restrict__ expert_of, u32* __restrict__ stamp, u32* __restrict__ uses,
    u32* __restrict__ clock, int* __restrict__ slot_ids, int* __restrict__ fills,
    int* __restrict__ fill_count, u64* __restrict__ stats, int lfu, u32 half_life,
    u32* __restrict__ ready, int ready_len, u32* __restrict__ prefetched, int prefetch) {
    pdl_begin();
    __shared__ u8 need[CACHE_MAX_THREADS];
    __shared__ int missing[CACHE_MAX_THREADS];
    __shared__ u64 keys[CACHE_MAX_THREADS];
    __shared__ int warp_misses[CACHE_MAX_THREADS / WARP_SIZE];
    __shared__ int warp_hits[CACHE_MAX_THREADS / WARP_SIZE];
    __shared__ u64 best_key[CACHE_MAX_THREADS / WARP_SIZE];
    __shared__ int best_at[CACHE_MAX_THREADS / WARP_SIZE];
    __shared__ u32 step;
    __shared__ int miss_total, hit_total, winner, prefetch_hits;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    if (tid == 0) {
        // A prefetch takes the last lookup's number: the slots that lookup used count as
        // this call's (kept), and the clock (the LFU's aging) counts real lookups only.
        step = clock[0] + (prefetch ? 0u : 1u);
        clock[0] = step;
        prefetch_hits = 0;
    }
    // The fills' progress counters of moe_cached.cu's launch that follows.
    for (int i = tid; i <= ready_len; i += blockDim.x) ready[i] = 0;
    need[tid] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        if (e >= 0 && e < n_expert) need[e] = 1;
    }
    __syncthreads();

    // Thread e looks at expert e: a hit stamps its slot, a miss is ranked by expert id.
    const bool needed = tid < n_expert && need[tid];
    const int held = needed ? slot_of[tid] : -1;
    const bool miss = needed && held < 0;
    if (needed && held >= 0) {
        stamp[held] = step;
        if (!prefetch && prefetched[held]) {
            prefetched[held] = 0;
            atomicAdd(&prefetch_hits, 1);
        }
    }
    if (lfu && tid < n_expert && !prefetch) {
        // Halving every half_life calls: a use counts half as much half_life calls later.
        const u32 count = step % half_life == 0 ? uses[tid] >> 1 : uses[tid];
        uses[tid] = count + (needed ? 1u : 0u);
    }
    const unsigned miss_bits = __ballot_sync(0xffffffffu, miss);
    const unsigned hit_bits = __ballot_sync(0xffffffffu, needed && !miss);
    if (lane == 0) {
        warp_misses[warp] = __popc(miss_bits);
        warp_hits[warp] = __popc(hit_bits);
    }
    __syncthreads();
    if (tid == 0) {
        int misses = 0, hits = 0;
        for (int w = 0; w < warps; ++w) {
            const int here = warp_misses[w];
            warp_misses[w] = misses;
            misses += here;
            hits += warp_hits[w];
        }
        miss_total = misses;
        hit_total = hits;
    }
    __syncthreads();
    if (miss) {
        missing[warp_misses[warp] + __popc(miss_bits & ((1u << lane) - 1u))] = tid;
    }
    // Stamps of this call's hits and the uses are written; every thread sees them after the
    // barriers above. This call's slots (stamped `step`) sort last under both policies.
    if (tid < slots) {
        const u32 last = stamp[tid];
        const int held_by = expert_of[tid];
        if (!lfu) {
            keys[tid] = last;
        } else if (last == step) {
            keys[tid] = ~0ull;
        } else {
            keys[tid] = (u64(held_by >= 0 ? uses[held_by] : 0u) << 32) | last;
        }
    }
    __syncthreads();

    const int misses = miss_total;
    const int free_slots = slots - hit_total;
    const int taken = min(misses, free_slots);
    // Each slot's rank in (key, slot) order, for the first `taken` ranks only: by repeated
    // minimum for a few victims (a decode step misses 0 to 10 experts: each round is two
    // barriers), else by counting for every slot the slots before it (O(slots) a thread).
    int rank = CACHE_MAX_THREADS;
    if (taken > 0 && taken <= CACHE_PICK_BY_MINIMUM) {
        bool picked = false;
        for (int r = 0; r < taken; ++r) {
            u64 key = tid < slots && !picked ? keys[tid] : ~0ull;
            int at = tid < slots && !picked ? tid : CACHE_MAX_THREADS;
            warp_min_key(key, at);
            if (lane == 0) best_key[warp] = key, best_at[warp] = at;
            __syncthreads();
            if (warp == 0) {
                key = lane < warps ? best_key[lane] : ~0ull;
                at = lane < warps ? best_at[lane] : CACHE_MAX_THREADS;
                warp_min_key(key, at);
                if (lane == 0) winner = at;
            }
            __syncthreads();
            if (tid == winner) rank = r, picked = true;
        }
    } else if (taken > 0 && tid < slots) {
        const u64 key = keys[tid];
        rank = 0;
        for (int s = 0; s < slots; ++s) {
            const u64 other = keys[s];
            rank += (other < key || (other == key && s < tid)) ? 1 : 0;
        }
    }
    // The first slots in key order go to the missing experts; an old expert leaves its slot
    // first (it is not needed by this call: needed ones sort last).
    const bool victim = rank < taken;
    if (victim) {
        const int old = expert_of[tid];
        if (old >= 0) slot_of[old] = -1;
    }
    __syncthreads();
    if (victim) {
        const int e = missing[rank];
        slot_of[e] = tid;
        expert_of[tid] = e;
        stamp[tid] = step;
        prefetched[tid] = prefetch ? 1u : 0u;
        fills[2 * rank] = e;
        fills[2 * rank + 1] = tid;
    }
    __syncthreads();
    for (int p = tid; p < pairs; p += blockDim.x) {
        const int e = ids[p];
        // A skipped pair (-2, moe.cu's SKIP_PAIR) stays skipped; other ids out of range get -1.
        slot_ids[p] = (e >= 0 && e < n_expert) ? slot_of[e] : (e == -2 ? -2 : -1);
    }
    if (tid == 0) {
        *fill_count = taken;
        if (prefetch) {
            stats[6] += u64(taken);
        } else {
            stats[0] += u64(hit_total);
            stats[1] += u64(taken);
            stats[2] += 1;
            if (misses > free_slots) stats[3] += 1;
            stats[5] = global_ns();
            stats[7] += u64(prefetch_hits);
        }
    }
}

// Copies the experts of `fills` (expert, slot pairs; `*fill_count` of them) from host
// memory mapped into the device's address space into their slots: grid.y is the fill, grid.z
// the tensor (gate, up, down), grid.x the chunk of `chunk` bytes. An expert's bytes are a
// multiple of 16 and both bases 16-byte aligned when `wide`.
__global__ void expert_cache_fill_kernel(
    const int* __restrict__ fills, const int* __restrict__ fill_count, const u8* __restrict__ host_gate,
    const u8* __restrict__ host_up, const u8* __restrict__ host_down, u8* __restrict__ gate,
    u8* __restrict__ up, u8* __restrict__ down, i64 gate_bytes, i64 down_bytes, i64 chunk, int wide) {
    pdl_begin();
    const int fill = blockIdx.y;
    if (fill >= *fill_count) return;
    const i64 expert = fills[2 * fill], slot = fills[2 * fill + 1];
    const int tensor = blockIdx.z;
    const i64 bytes = tensor == 2 ? down_bytes : gate_bytes;
    const u8* src = (tensor == 0 ? host_gate : tensor == 1 ? host_up : host_down) + expert * bytes;
    u8* dst = (tensor == 0 ? gate : tensor == 1 ? up : down) + slot * bytes;
    copy_expert_chunk(src, dst, bytes, i64(blockIdx.x) * chunk, chunk, wide);
}
