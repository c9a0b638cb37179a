// Dequantize a whole matrix of weight blocks to f32 (rows are whole blocks, so the
// matrix is one run of blocks). One thread per item; needs common.cuh, the tables and
// blocks.cuh before it.

template <class B>
__global__ void dequantize_kernel(const u8* __restrict__ weights, float* __restrict__ out,
                                  i64 total_items) {
    B::prepare();
    const i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total_items) return;
    const i64 block = i / B::ITEMS;
    const int item = int(i % B::ITEMS);
    float* y = out + block * B::VALUES;
    B::decode(weights + block * B::BYTES, item, [&](int index, float value) { y[index] = value; });
}

// The same to f16 (round to nearest): the weights of a cuBLAS prompt product (cublas.rs).
template <class B>
__global__ void dequantize_f16_kernel(const u8* __restrict__ weights, u16* __restrict__ out,
                                      i64 total_items) {
    B::prepare();
    const i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total_items) return;
    const i64 block = i / B::ITEMS;
    const int item = int(i % B::ITEMS);
    u16* y = out + block * B::VALUES;
    B::decode(weights + block * B::BYTES, item,
              [&](int index, float value) { y[index] = f32_to_f16(value); });
}

// f32 to f16 (round to nearest), one thread per value: a cuBLAS product's activations.
__global__ void to_f16_kernel(const float* __restrict__ x, u16* __restrict__ out, i64 n) {
    const i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_f16(x[i]);
}
