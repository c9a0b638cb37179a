// Warp and block reductions shared by the layer kernels (elementwise, matmul, deltanet,
// attention, moe), and the dot of one weight row with an f32 vector. Needs common.cuh,
// the tables and blocks.cuh before it.

// NVRTC has no math.h.
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif

static __device__ __forceinline__ float warp_reduce_sum(float value) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

static __device__ __forceinline__ float warp_reduce_max(float value) {
#pragma unroll
    for (int offset = WARP_SIZE / 2; offset > 0; offset >>= 1) {
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    }
    return value;
}

// Sum over the CTA (blockDim.x a multiple of 32); every thread gets the result.
// `scratch` holds at least 32 floats; the leading barrier makes back-to-back calls safe.
static __device__ __forceinline__ float block_reduce_sum(float value, float* scratch) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    value = warp_reduce_sum(value);
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    return warp_reduce_sum(lane < warps ? scratch[lane] : 0.0f);
}

static __device__ __forceinline__ float block_reduce_max(float value, float* scratch) {
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    value = warp_reduce_max(value);
    __syncthreads();
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    return warp_reduce_max(lane < warps ? scratch[lane] : -INFINITY);
}

static __device__ __forceinline__ float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

static __device__ __forceinline__ float siluf(float x) { return x * sigmoidf(x); }

// Sum over aligned groups of LANES lanes (a power of two ≤ 32); every lane of a group gets
// its group's sum. All 32 lanes must take part.
template <int LANES>
static __device__ __forceinline__ float group_reduce_sum(float value) {
#pragma unroll
    for (int offset = LANES / 2; offset > 0; offset >>= 1) {
        value += __shfl_xor_sync(0xffffffffu, value, offset);
    }
    return value;
}

// This lane's share of W_row · x (cols values, whole blocks of B) when LANES lanes share the
// row and this is lane `lane` of them; reduce over those lanes.
template <class B, int LANES = WARP_SIZE>
static __device__ __forceinline__ float row_dot_lane(const u8* __restrict__ row,
                                                     const float* __restrict__ x, int cols,
                                                     int lane) {
    const int items = cols / B::VALUES * B::ITEMS;
    float acc = 0.0f;
    for (int i = lane; i < items; i += LANES) {
        const int block = i / B::ITEMS, item = i % B::ITEMS;
        const float* xb = x + block * B::VALUES;
        B::decode(row + i64(block) * B::BYTES, item,
                  [&](int index, float value) { acc = fmaf(value, xb[index], acc); });
    }
    return acc;
}
