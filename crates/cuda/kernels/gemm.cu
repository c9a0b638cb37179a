// Prompt products with float weight matrices (F32 or F16: the MoE router, the shared-expert
// gate, every matrix of an all-F32/F16 file): y[t][r] = Σ_c W[r][c] x[t][c] as a tiled
// GEMM. The matvec kernels re-read a row per token (one CTA per row and token for the
// router's 512 rows: 37.9 µs a token on the H200); here a CTA stages BK columns of BM rows
// and of BN tokens in shared memory and each thread keeps a TM x TN block of outputs in
// registers, so each weight value is read once per BN tokens.
// Sums: each output's terms are added in column order, one fmaf each (a single chain, not
// the warp-strided order of the matvecs: the results differ by rounding).
// Requirements (the launcher checks them): cols % 4 == 0 and a 16-byte aligned base, so that
// each row's float4 (F32) or 4-half (F16) loads are aligned. Needs the prelude.

template <class W>
struct FloatRow;

template <>
struct FloatRow<float> {
    static __device__ __forceinline__ float4 load4(const u8* base, i64 index) {
        return *reinterpret_cast<const float4*>(base + index * 4);
    }
};

template <>
struct FloatRow<u16> {
    static __device__ __forceinline__ float4 load4(const u8* base, i64 index) {
        const uint2 bits = *reinterpret_cast<const uint2*>(base + index * 2);
        return make_float4(f16_to_f32(u16(bits.x)), f16_to_f32(u16(bits.x >> 16)),
                           f16_to_f32(u16(bits.y)), f16_to_f32(u16(bits.y >> 16)));
    }
};

constexpr int GEMM_THREADS = 256;
constexpr int GEMM_BK = 32;

// Grid (ceil(rows / BM), ceil(tokens / BN)), GEMM_THREADS threads as 16 x 16; thread (i, j)
// owns rows i * TM .. +TM and tokens j * TN .. +TN of the CTA's tile. BN = 32 (TN = 2) for
// grids that 64-token tiles would leave smaller than the GPU (the router at 512 tokens: 64
// CTAs on 132 multiprocessors). Shared tiles are
// stored k-major (ws[k][row], xs[k][token]) so the inner loop reads TM and TN consecutive
// floats; the +4 pad keeps those reads 16-byte aligned.
template <class W, int BM, int BN>
__global__ void __launch_bounds__(GEMM_THREADS)
gemm_float_kernel(const u8* __restrict__ weights, const float* __restrict__ x,
                  float* __restrict__ y, int rows, int cols, int tokens) {
    pdl_begin();
    constexpr int TM = BM / 16, TN = BN / 16, KQ = GEMM_BK / 4;
    static_assert(TM == 4 && (TN == 4 || TN == 2), "the inner loop reads a float4 of weights");
    __shared__ __align__(16) float ws[GEMM_BK][BM + 4];
    __shared__ __align__(16) float xs[GEMM_BK][BN + 4];
    const int row0 = blockIdx.x * BM, tok0 = blockIdx.y * BN;
    const int ti = threadIdx.x / 16, tj = threadIdx.x % 16;
    float acc[TM][TN];
#pragma unroll
    for (int m = 0; m < TM; ++m)
#pragma unroll
        for (int n = 0; n < TN; ++n) acc[m][n] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += GEMM_BK) {
        // Rows (and tokens) past the matrix, and columns past cols, load as zeros: a zero
        // term leaves a sum unchanged.
        for (int i = threadIdx.x; i < BM * KQ; i += GEMM_THREADS) {
            const int r = i / KQ, k = (i % KQ) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (row0 + r < rows && k0 + k < cols)
                v = FloatRow<W>::load4(weights, i64(row0 + r) * cols + k0 + k);
            ws[k][r] = v.x;
            ws[k + 1][r] = v.y;
            ws[k + 2][r] = v.z;
            ws[k + 3][r] = v.w;
        }
        for (int i = threadIdx.x; i < BN * KQ; i += GEMM_THREADS) {
            const int t = i / KQ, k = (i % KQ) * 4;
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (tok0 + t < tokens && k0 + k < cols)
                v = *reinterpret_cast<const float4*>(x + i64(tok0 + t) * cols + k0 + k);
            xs[k][t] = v.x;
            xs[k + 1][t] = v.y;
            xs[k + 2][t] = v.z;
            xs[k + 3][t] = v.w;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < GEMM_BK; ++k) {
            const float4 a = *reinterpret_cast<const float4*>(&ws[k][ti * TM]);
            const float av[4] = {a.x, a.y, a.z, a.w};
            float bv[TN];
            if constexpr (TN == 4) {
                const float4 b = *reinterpret_cast<const float4*>(&xs[k][tj * TN]);
                bv[0] = b.x, bv[1] = b.y, bv[2] = b.z, bv[3] = b.w;
            } else {
                const float2 b = *reinterpret_cast<const float2*>(&xs[k][tj * TN]);
                bv[0] = b.x, bv[1] = b.y;
            }
#pragma unroll
            for (int m = 0; m < TM; ++m)
#pragma unroll
                for (int n = 0; n < TN; ++n) acc[m][n] = fmaf(av[m], bv[n], acc[m][n]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < TN; ++n) {
        const int t = tok0 + tj * TN + n;
        if (t >= tokens) continue;
#pragma unroll
        for (int m = 0; m < TM; ++m) {
            const int r = row0 + ti * TM + m;
            if (r < rows) y[i64(t) * rows + r] = acc[m][n];
        }
    }
}
