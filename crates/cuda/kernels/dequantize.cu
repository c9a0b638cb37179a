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
