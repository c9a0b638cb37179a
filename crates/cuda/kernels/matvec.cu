// y = W x for one weight type: W is `rows` rows of `cols` values stored as blocks, x and y
// f32. One warp per row, WARPS rows per CTA; lanes walk the row's items so that a warp's
// loads cover consecutive bytes; f32 accumulation, one warp reduction per row. With
// X_SHARED the CTA stages x in dynamic shared memory (cols * 4 bytes) first.
// Needs common.cuh, the tables and blocks.cuh before it.

static __device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

template <class B, int WARPS, bool X_SHARED>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matvec_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
              float* __restrict__ y, int rows, int cols) {
    pdl_begin();
    B::prepare();
    extern __shared__ float x_shared[];
    const float* xs = x;
    if (X_SHARED) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) x_shared[i] = x[i];
        __syncthreads();
        xs = x_shared;
    }
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= rows) return;
    const int blocks_per_row = cols / B::VALUES;
    const u8* w = weights + i64(row) * blocks_per_row * B::BYTES;
    const int items = blocks_per_row * B::ITEMS;
    float acc = 0.0f;
    for (int i = lane; i < items; i += WARP_SIZE) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const float* xb = xs + block * B::VALUES;
        B::decode(w + i64(block) * B::BYTES, item,
                  [&](int index, float value) { acc = fmaf(value, xb[index], acc); });
    }
    acc = warp_sum(acc);
    if (lane == 0) y[row] = acc;
}
