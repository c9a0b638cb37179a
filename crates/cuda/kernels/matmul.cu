// y[t] = W x[t] for a batch of tokens (grid.y = token): the matvec of matvec.cu with a
// token stride, so a prefill chunk is one launch. One warp per row, WARPS rows per CTA;
// with X_SHARED the CTA stages x[t] in dynamic shared memory (cols * 4 bytes). Weights are
// re-read per token (correct, not fast, for T > 1). Needs the prelude and reduce.cuh.

template <class B, int WARPS, bool X_SHARED>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
              float* __restrict__ y, int rows, int cols) {
    pdl_begin();
    B::prepare();
    extern __shared__ float x_shared[];
    const float* xs = x + i64(blockIdx.y) * cols;
    if (X_SHARED) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) x_shared[i] = xs[i];
        __syncthreads();
        xs = x_shared;
    }
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= rows) return;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const float acc = warp_reduce_sum(row_dot_lane<B>(weights + row * row_bytes, xs, cols, lane));
    if (lane == 0) y[i64(blockIdx.y) * rows + row] = acc;
}

// Version 2 (the default): ROWS consecutive rows per warp, WARPS warps per CTA. The warp's
// lanes take the same items of its ROWS rows, so their loads are in flight together and
// each x value is read from shared memory once for all of them; x[t] is staged once per
// WARPS * ROWS rows instead of once per WARPS. Each row's sum runs in the order of version
// 1 (lane-strided items, then one warp reduction), so the results are the same bits.
template <class B, int WARPS, int ROWS, bool X_SHARED>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_v2_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                 float* __restrict__ y, int rows, int cols) {
    pdl_begin();
    PROBE_RETURN(PROBE_MATMUL);
    B::prepare();
    extern __shared__ float4 x_shared4[];
    const float* xs = x + i64(blockIdx.y) * cols;
    if (X_SHARED) {
        float* x_shared = reinterpret_cast<float*>(x_shared4);
        if ((cols & 3) == 0 && (reinterpret_cast<u64>(xs) & 15) == 0) {
            const float4* x4 = reinterpret_cast<const float4*>(xs);
            for (int i = threadIdx.x; i < cols / 4; i += blockDim.x) x_shared4[i] = x4[i];
        } else {
            for (int i = threadIdx.x; i < cols; i += blockDim.x) x_shared[i] = xs[i];
        }
        __syncthreads();
        xs = x_shared;
    }
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row0 = (blockIdx.x * WARPS + warp) * ROWS;
    if (row0 >= rows) return;
    const int valid = min(ROWS, rows - row0);
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const int items = cols / B::VALUES * B::ITEMS;
    const u8* w = weights + i64(row0) * row_bytes;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
#pragma unroll 2
    for (int i = lane; i < items; i += WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const float* xb = xs + block * B::VALUES;
        const u8* wb = w + i64(block) * B::BYTES;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < valid) {
                B::decode(wb + r * row_bytes, item,
                          [&](int index, float value) { acc[r] = fmaf(value, xb[index], acc[r]); });
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float sum = warp_reduce_sum(acc[r]);
        if (lane == 0 && r < valid) y[i64(blockIdx.y) * rows + row0 + r] = sum;
    }
}

// Version q8 (the default for the types of q8dot.cuh under the backend's `Precision::Ggml`;
// version 2 stays for `Precision::Exact` and the other types): version 2's layout, with x[t]
// quantized to Q8_K into shared memory by each CTA (or read quantized from `gd`, `gq`:
// `q8_input`) and integer block dots; the first token's CTAs ask L2 for their rows before
// quantizing (`prefetch_before_input`). Dynamic shared memory: q8_scales_bytes(cols) + cols
// bytes (none with `gq`).
template <class B, int WARPS, int ROWS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_q8_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                 const float* __restrict__ gd, const i8* __restrict__ gq,
                 float* __restrict__ y, int rows, int cols) {
    PROBE_RETURN(PROBE_MATMUL);
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    const float* xd;
    const i8* xq;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row0 = (blockIdx.x * WARPS + warp) * ROWS;
    const int valid = min(ROWS, rows - row0);
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* w = weights + i64(row0) * row_bytes;
    // The warp's rows are contiguous: ask L2 for them while x is quantized.
    if (row0 < rows && blockIdx.y == 0 && prefetch_before_input(gq)) {
        prefetch_l2(w, valid * row_bytes, lane, WARP_SIZE);
    }
#if REDLITE_Q8_LOADS_AHEAD
    constexpr int AHEAD = Q8Ahead<typename Q8Dot<B>::Raw>::of(Q8Dot<B>::PRELOAD, ROWS);
#else
    constexpr int AHEAD = 0;
#endif
    // Under PDL, with x already quantized (`gq`), the lane's first weight items are loaded
    // before the wait, while the previous kernel still runs (nothing of the step writes
    // weights); else x comes first (the items would stay live across its quantization).
    const bool early = REDLITE_PDL != 0 && AHEAD > 0 && gq != nullptr;
    // x after the wait; false when the warp has no rows.
    const auto take_input = [&] {
        pdl_begin_as("matmul_q8_kernel");
        q8_input(x, gd, gq, blockIdx.y, 1, cols, q8_shared, xd, xq);
        return row0 < rows;
    };
    if (!early && !take_input()) return;
    const int items = cols / B::VALUES * B::ITEMS;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) acc[r] = 0.0f;
    int first = lane;
    // The lane's first items of each row loaded before any of them is used: one wait on
    // DRAM for all of them instead of one per item (the compiler issued the second item's
    // loads after the first item's lookups). Summed in the loop's order.
    if constexpr (AHEAD > 0) {
        if (early) {
            // The rest of the warp's rows (contiguous) asked of L2 before the wait too.
            const i64 ahead_bytes = i64(AHEAD * WARP_SIZE / B::ITEMS) * B::BYTES;
            if (row0 < rows && blockIdx.y == 0 && ahead_bytes < row_bytes) {
                prefetch_l2(w + ahead_bytes, valid * row_bytes - ahead_bytes, lane, WARP_SIZE);
            }
        }
        typename Q8Dot<B>::Raw raw[AHEAD][ROWS];
#pragma unroll
        for (int p = 0; p < AHEAD; ++p) {
            const int i = lane + p * WARP_SIZE;
            const u8* wb = w + i64(i / B::ITEMS) * B::BYTES;
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                if (i < items && r < valid) {
                    raw[p][r] = Q8Dot<B>::load(wb + r * row_bytes, i % B::ITEMS);
                }
            }
        }
        if (early && !take_input()) return;
#pragma unroll
        for (int p = 0; p < AHEAD; ++p) {
            const int i = lane + p * WARP_SIZE;
            if (i < items) {
                const int block = i / B::ITEMS, item = i % B::ITEMS;
                const i8* qb = xq + block * B::VALUES;
                const float db = xd[block];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    if (r < valid) acc[r] += Q8Dot<B>::dot(raw[p][r], item, qb, db);
                }
            }
        }
        first = lane + AHEAD * WARP_SIZE;
    }
#pragma unroll 2
    for (int i = first; i < items; i += WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const i8* qb = xq + block * B::VALUES;
        const float db = xd[block];
        const u8* wb = w + i64(block) * B::BYTES;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r < valid) acc[r] += Q8Dot<B>::dot(wb + r * row_bytes, item, qb, db);
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const float sum = warp_reduce_sum(acc[r]);
        if (lane == 0 && r < valid) y[i64(blockIdx.y) * rows + row0 + r] = sum;
    }
}

// Split-K version for matrices of few rows (the router, the shared-expert gate, the
// DeltaNet beta/alpha and attention k/v projections), where one warp per row would leave
// most multiprocessors idle: one CTA per row (grid (rows, tokens)), all WARPS warps share
// the row's items, one CTA reduction. x is read straight from global memory (each value is
// used once per CTA). `REDLITE_MATMUL_SPLITK=0` keeps version 2 for every shape.
template <class B, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_splitk_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                     float* __restrict__ y, int rows, int cols) {
    PROBE_RETURN(PROBE_SPLITK);
    B::prepare();
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
#if REDLITE_PDL
    // The row asked of L2 while the previous kernel still runs.
    if (blockIdx.y == 0) {
        prefetch_l2(weights + row * row_bytes, row_bytes, threadIdx.x, WARPS * WARP_SIZE);
    }
#endif
    pdl_begin();
    const float part = row_dot_lane<B, WARPS * WARP_SIZE>(
        weights + row * row_bytes, x + i64(blockIdx.y) * cols, cols, threadIdx.x);
    const float sum = block_reduce_sum(part, scratch);
    if (threadIdx.x == 0) y[i64(blockIdx.y) * rows + row] = sum;
}

// The same on Q8_K activations (quantized into shared memory, or read quantized from `gd`,
// `gq`, as matmul_q8_kernel).
template <class B, int WARPS>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_splitk_q8_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                        const float* __restrict__ gd, const i8* __restrict__ gq,
                        float* __restrict__ y, int rows, int cols) {
    q8_prepare<B>();
    extern __shared__ float4 q8_shared[];
    __shared__ float scratch[32];
    const float* xd;
    const i8* xq;
    const int row = blockIdx.x;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* w = weights + row * row_bytes;
    // Under PDL the row is asked of L2 while the previous kernel still runs.
    if (blockIdx.y == 0 && (REDLITE_PDL || prefetch_before_input(gq))) {
        prefetch_l2(w, row_bytes, threadIdx.x, WARPS * WARP_SIZE);
    }
    pdl_begin();
    q8_input(x, gd, gq, blockIdx.y, 1, cols, q8_shared, xd, xq);
    const float part = row_dot_lane_q8<B, WARPS * WARP_SIZE>(w, xq, xd, cols, threadIdx.x);
    const float sum = block_reduce_sum(part, scratch);
    if (threadIdx.x == 0) y[i64(blockIdx.y) * rows + row] = sum;
}

// The small split-K products' ends: token j's CTA partials summed (block_reduce_sum, as the
// one-token split-K kernels) and stored at y[j][row], for the batch's nt tokens.
template <int NT>
static __device__ __forceinline__ void store_token_sums(const float (&acc)[NT], int nt,
                                                        float* scratch, float* __restrict__ y,
                                                        int rows, int row) {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        if (j < nt) {
            const float sum = block_reduce_sum(acc[j], scratch);
            if (threadIdx.x == 0) y[i64(j) * rows + row] = sum;
        }
    }
}

// The split-K float product of a small batch (an MTP verification's router logits, F32 or
// F16 rows): all NT tokens in each CTA (grid (rows, 1)), each weight item loaded once for the
// NT sums instead of once a token in a CTA a token. Per token the values, the threads that
// hold them, their order (fmaf in row_dot_lane's) and the block reduction are
// matmul_splitk_kernel's: the same bits.
template <class B, int WARPS, int NT>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_splitk_small_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                           float* __restrict__ y, int rows, int cols, int tokens) {
    B::prepare();
    __shared__ float scratch[32];
    const int row = blockIdx.x;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* w = weights + row * row_bytes;
#if REDLITE_PDL
    prefetch_l2(w, row_bytes, threadIdx.x, WARPS * WARP_SIZE);
#endif
    pdl_begin();
    const int nt = min(NT, tokens);
    const int items = cols / B::VALUES * B::ITEMS;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    for (int i = threadIdx.x; i < items; i += WARPS * WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        B::decode(w + i64(block) * B::BYTES, item, [&](int index, float value) {
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (j < nt) {
                    acc[j] = fmaf(value, x[i64(j) * cols + block * B::VALUES + index], acc[j]);
                }
            }
        });
    }
    store_token_sums<NT>(acc, nt, scratch, y, rows, row);
}

// The split-K q8 product of a small batch (an MTP verification's few-row projections: the
// attention's k and v, the DeltaNet's beta and alpha): all NT tokens in each CTA (grid (rows,
// 1)), so each weight item is loaded and decoded once (`Q8Decode`) for the NT dots instead of
// once a token in a CTA a token. Per token the terms, the threads that hold them, their order
// and the block reduction are matmul_splitk_q8_kernel's: the same bits.
template <class B, int WARPS, int NT>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_splitk_q8_small_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                              const float* __restrict__ gd, const i8* __restrict__ gq,
                              float* __restrict__ y, int rows, int cols, int tokens) {
#if !REDLITE_Q8_DECODE_ONCE
    q8_prepare<B>();
#endif
    extern __shared__ float4 q8_shared[];
    __shared__ float scratch[32];
    const float* xd;
    const i8* xq;
    const int row = blockIdx.x;
    const int nb = cols / Q8K_VALUES;
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* w = weights + row * row_bytes;
    if (REDLITE_PDL || prefetch_before_input(gq)) {
        prefetch_l2(w, row_bytes, threadIdx.x, WARPS * WARP_SIZE);
    }
    pdl_begin();
    const int nt = min(NT, tokens);
    q8_input(x, gd, gq, 0, nt, cols, q8_shared, xd, xq);
    const int items = cols / B::VALUES * B::ITEMS;
    float acc[NT];
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[j] = 0.0f;
    for (int i = threadIdx.x; i < items; i += WARPS * WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const auto weights_of_item =
            Q8Decode<B>::decode(Q8Dot<B>::load(w + i64(block) * B::BYTES, item), item);
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            if (j < nt) {
                acc[j] += Q8Decode<B>::dot(weights_of_item, item, xq + j * cols + block * B::VALUES,
                                           xd[j * nb + block]);
            }
        }
    }
    store_token_sums<NT>(acc, nt, scratch, y, rows, row);
}

// CTAs a multiprocessor must hold (ptxas keeps the registers to that; 0: the compiler's
// choice). A small batch takes two rows a warp only where one would need a second wave
// (`small_batch_rows`), which holds only at four CTAs of 8 warps a multiprocessor: 64
// registers (the compiler's choice went to 68-80 for 3 and 4 tokens). Registers only: the
// same bits.
template <int ROWS, int NT>
struct TilesMinBlocks {
    static constexpr int value = ROWS == 2 && NT <= 4 ? 4 : 0;
};

// Token tiles for prompt ingestion (the default for several tokens; `REDLITE_PREFILL_TILES=0`
// turns them off): grid (ceil(rows / (WARPS x ROWS)), ceil(tokens / NT)); each CTA quantizes NT
// consecutive tokens' x into shared memory (NT x cols codes, they are contiguous rows) and
// each warp takes ROWS rows for all NT tokens, so a weight item is loaded and decoded once
// for NT products instead of once per token (`Q8Decode`: the codebook lookups, sign masks,
// nibbles and scales before the tokens' dots). Sums per (row, token) run in matmul_q8_kernel's
// lane order: the same terms, summed in the same order for each token.
template <class B, int WARPS, int ROWS, int NT>
__global__ void __launch_bounds__(WARPS * WARP_SIZE, (TilesMinBlocks<ROWS, NT>::value))
matmul_q8_tiles_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                       const float* __restrict__ gd, const i8* __restrict__ gq,
                       float* __restrict__ y, int rows, int cols, int tokens) {
    const int t0 = blockIdx.y * NT, nt = min(NT, tokens - t0);
    const int nb = cols / Q8K_VALUES;
    const float* xd;
    const i8* xq;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row0 = (blockIdx.x * WARPS + warp) * ROWS;
    const int valid = min(ROWS, rows - row0);
    const i64 row_bytes = i64(cols / B::VALUES) * B::BYTES;
    const u8* w = weights + i64(row0) * row_bytes;
    // The rows asked of L2 before the wait (no kernel writes weights): under PDL (a small
    // batch: an MTP verification, serving slots) while the previous kernel still runs.
    if (row0 < rows) prefetch_l2(w, valid * row_bytes, lane, WARP_SIZE);
    const int items = cols / B::VALUES * B::ITEMS;
    pdl_begin();
#if !REDLITE_Q8_DECODE_ONCE
    // Decoding once, no type reads a table from shared memory (q8decode.cuh).
    q8_prepare<B>();
#endif
    extern __shared__ float4 q8_shared[];
    q8_input(x, gd, gq, t0, nt, cols, q8_shared, xd, xq);
    if (row0 >= rows) return;
    float acc[ROWS][NT];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int j = 0; j < NT; ++j) acc[r][j] = 0.0f;
    }
    for (int i = lane; i < items; i += WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const u8* wb = w + i64(block) * B::BYTES;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            if (r >= valid) continue;
            const auto weights_of_item =
                Q8Decode<B>::decode(Q8Dot<B>::load(wb + r * row_bytes, item), item);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                if (j < nt) {
                    acc[r][j] += Q8Decode<B>::dot(weights_of_item, item,
                                                  xq + j * cols + block * B::VALUES,
                                                  xd[j * nb + block]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float sum = warp_reduce_sum(acc[r][j]);
            if (lane == 0 && r < valid && j < nt) y[i64(t0 + j) * rows + row0 + r] = sum;
        }
    }
}
