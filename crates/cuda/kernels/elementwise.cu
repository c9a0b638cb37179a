// Embedding gather, RMSNorm over rows, residual add. Needs common.cuh, the tables,
// blocks.cuh and reduce.cuh before it.

// x[t] = decode(table row tokens[t]); one CTA per token, threads walk the row's items.
// An id past the table gives zeros (the engine refuses such ids before launching).
template <class B>
__global__ void embed_kernel(const u8* __restrict__ table, const u32* __restrict__ tokens,
                             float* __restrict__ x, int rows, int cols) {
    B::prepare();
    const int t = blockIdx.x;
    const int blocks_per_row = cols / B::VALUES;
    if (tokens[t] >= u32(rows)) {
        for (int i = threadIdx.x; i < cols; i += blockDim.x) x[i64(t) * cols + i] = 0.0f;
        return;
    }
    const u8* row = table + i64(tokens[t]) * blocks_per_row * B::BYTES;
    float* out = x + i64(t) * cols;
    const int items = blocks_per_row * B::ITEMS;
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        float* y = out + block * B::VALUES;
        B::decode(row + i64(block) * B::BYTES, item,
                  [&](int index, float value) { y[index] = value; });
    }
}

// out[r] = x[r] * w / sqrt(mean(x[r]^2) + eps); one CTA per row (in place is allowed).
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float* out,
                                int cols, float eps) {
    __shared__ float scratch[32];
    const float* xr = x + i64(blockIdx.x) * cols;
    float* o = out + i64(blockIdx.x) * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_reduce_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / float(cols) + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}

// x += y over n values.
__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

// x[r] += y[r], then out[r] = x[r] * w / sqrt(mean(x[r]^2) + eps): add_kernel then
// rms_norm_kernel in one launch (one CTA per row), the same bits: each thread adds its own
// values and sums their squares in rms_norm_kernel's order. out must not alias x or y.
__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ y,
                                    const float* __restrict__ w, float* __restrict__ out,
                                    int cols, float eps) {
    __shared__ float scratch[32];
    float* xr = x + i64(blockIdx.x) * cols;
    const float* yr = y + i64(blockIdx.x) * cols;
    float* o = out + i64(blockIdx.x) * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i] + yr[i];
        xr[i] = v;
        ss += v * v;
    }
    ss = block_reduce_sum(ss, scratch);
    const float scale = 1.0f / sqrtf(ss / float(cols) + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) o[i] = xr[i] * scale * w[i];
}
