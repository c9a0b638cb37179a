// Dequantize a whole matrix of weight blocks to f32 (rows are whole blocks, so the
// matrix is one run of blocks). One thread per item; needs common.cuh, the tables and
// blocks.cuh before it.

template <class B>
__global__ void dequantize_kernel(const u8* __restrict__ weights, float* __restrict__ out,
                                  i64 total_items) {
    pdl_begin();
    B::prepare();
    const i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= total_items) return;
    const i64 block = i / B::ITEMS;
    const int item = int(i % B::ITEMS);
    float* y = out + block * B::VALUES;
    B::decode(weights + block * B::BYTES, item, [&](int index, float value) { y[index] = value; });
}

// The same to f16 (round to nearest): the weights of a cuBLAS prompt product (cublas.rs).
// DEQUANT_F16_THREADS threads decode as many items into shared memory, then the CTA writes the
// values out with 16-byte stores (one thread per item wrote 2 bytes at a time, ~420 GB/s).
#define DEQUANT_F16_THREADS 256

template <class B>
__global__ void __launch_bounds__(DEQUANT_F16_THREADS)
dequantize_f16_kernel(const u8* __restrict__ weights, u16* __restrict__ out, i64 total_items) {
    pdl_begin();
    static_assert(DEQUANT_F16_THREADS % B::ITEMS == 0, "a CTA decodes whole blocks");
    constexpr int BLOCKS = DEQUANT_F16_THREADS / B::ITEMS, VALUES = BLOCKS * B::VALUES;
    __shared__ __align__(16) u16 tile[VALUES];
    B::prepare();
    const i64 first_block = i64(blockIdx.x) * BLOCKS;
    const i64 total_blocks = total_items / B::ITEMS;
    const i64 i = first_block * B::ITEMS + threadIdx.x;
    if (i < total_items) {
        const int local = threadIdx.x / B::ITEMS, item = threadIdx.x % B::ITEMS;
        u16* y = tile + local * B::VALUES;
        B::decode(weights + (first_block + local) * B::BYTES, item,
                  [&](int index, float value) { y[index] = f32_to_f16(value); });
    }
    __syncthreads();
    const i64 blocks_here = total_blocks - first_block < BLOCKS ? total_blocks - first_block : BLOCKS;
    const int values = int(blocks_here) * B::VALUES;
    u16* dst = out + first_block * B::VALUES;
    if ((values & 7) == 0 && (reinterpret_cast<u64>(dst) & 15) == 0) {
        const uint4* src4 = reinterpret_cast<const uint4*>(tile);
        uint4* dst4 = reinterpret_cast<uint4*>(dst);
        for (int v = threadIdx.x; v < values / 8; v += DEQUANT_F16_THREADS) dst4[v] = src4[v];
    } else {
        for (int v = threadIdx.x; v < values; v += DEQUANT_F16_THREADS) dst[v] = tile[v];
    }
}

// f32 to f16 (round to nearest), one thread per value: a cuBLAS product's activations.
__global__ void to_f16_kernel(const float* __restrict__ x, u16* __restrict__ out, i64 n) {
    pdl_begin();
    const i64 i = i64(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) out[i] = f32_to_f16(x[i]);
}
