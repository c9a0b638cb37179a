// y[t] = W x[t] for a batch of tokens (grid.y = token): the matvec of matvec.cu with a
// token stride, so a prefill chunk is one launch. One warp per row, WARPS rows per CTA;
// with X_SHARED the CTA stages x[t] in dynamic shared memory (cols * 4 bytes). Weights are
// re-read per token (correct, not fast, for T > 1). Needs the prelude and reduce.cuh.

template <class B, int WARPS, bool X_SHARED>
__global__ void __launch_bounds__(WARPS * WARP_SIZE)
matmul_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
              float* __restrict__ y, int rows, int cols) {
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
