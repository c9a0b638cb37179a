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

// One level of warp_reduce_sum_each's halving: PART values a lane, of which the first 2 x HALF
// are live; afterwards the first HALF are (a template recursion: a loop over the levels left
// the 32-value arrays in local memory).
template <int PART, int HALF>
static __device__ __forceinline__ void halve_warp_sums(float (&s)[PART], int lane) {
    if constexpr (HALF >= 1) {
        constexpr int OFFSET = WARP_SIZE * HALF / PART;
        const bool upper = (lane & OFFSET) != 0;
#pragma unroll
        for (int i = 0; i < HALF; ++i) {
            const float keep = upper ? s[i + HALF] : s[i];
            const float send = upper ? s[i] : s[i + HALF];
            s[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
        }
        halve_warp_sums<PART, HALF / 2>(s, lane);
    }
}

// warp_reduce_sum of each of the R x C values (their count a power of two), every lane
// getting every total, with fewer shuffles: per 32 values, recursive halving (at offset o the
// lanes with bit o set keep the upper half of their values and send the lower, the others the
// reverse; each adds the value received to the one it keeps), then the butterfly's remaining
// offsets on the one value left, then a broadcast of each total from a lane that holds it:
// 31 + 32 shuffles for 32 values, 15 + 1 + 16 for 16, instead of 5 a value. Every addition is
// the butterfly's (a lane's own partial plus its partner's for the same value, and the
// butterfly's lanes all end with the same bits), so the totals are warp_reduce_sum's bit for
// bit. All 32 lanes must take part.
template <int R, int C>
static __device__ __forceinline__ void warp_reduce_sum_each(float (&v)[R][C]) {
    constexpr int N = R * C;
    static_assert(N > 0 && (N & (N - 1)) == 0, "a power of two of values");
    constexpr int PART = N < WARP_SIZE ? N : WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
#pragma unroll
    for (int first = 0; first < N; first += PART) {
        float s[PART];
#pragma unroll
        for (int i = 0; i < PART; ++i) s[i] = v[(first + i) / C][(first + i) % C];
        halve_warp_sums<PART, PART / 2>(s, lane);
        // Value i of the part is now (partly summed) in lanes i * (WARP_SIZE / PART) onwards.
        float total = s[0];
#pragma unroll
        for (int offset = WARP_SIZE / PART / 2; offset > 0; offset /= 2) {
            total += __shfl_xor_sync(0xffffffffu, total, offset);
        }
#pragma unroll
        for (int i = 0; i < PART; ++i) {
            v[(first + i) / C][(first + i) % C] =
                __shfl_sync(0xffffffffu, total, i * (WARP_SIZE / PART));
        }
    }
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
