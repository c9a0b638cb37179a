// The delta rule over a prompt in chunks of CHUNK tokens (spec §3.2 step 5′; the CPU's
// `delta_rule::chunked` is the reference). Per v-head, from the state S0 at a chunk's start,
// with G_i = Σ_{m≤i} g_m the cumulative log decay inside the chunk:
//   R_i = v_i − e^{G_i} S0ᵀ k_i
//   A_ij = β_i e^{G_i − G_j} (k_i · k_j) for j < i;  (I + A) Δ = β ⊙ R (forward substitution)
//   o_i = e^{G_i} S0ᵀ q_i + Σ_{j≤i} e^{G_i − G_j} (q_i · k_j) Δ_j
//   S ← e^{G_last} S0 + Σ_j e^{G_last − G_j} k_j Δ_jᵀ
// the token loop's result up to rounding. Rows past the end of a partial chunk are zero
// (k, q, v, β = 0, g = 0), so their Δ is zero and they change nothing.
//
// Work split. Value columns are independent: CTA (h, block) owns COLS = 32 columns of v-head
// h's state (DK x 32 floats in shared memory) and walks the chunks in order. The chunk's k·k
// and q·k Gram matrices do not depend on the columns; each CTA computes them itself, which
// repeats them for the dv / 32 CTAs of a head (and the r v-heads of a k-head). A first
// kernel could compute them once per k-head, but it needs a scratch of 2 x 64 x 64 floats per
// chunk and k-head in global memory and a second launch, and at Qwen3-Next's shape the grid
// is 32 x 4 = 128 CTAs: one CTA per SM of the H200 (132), one wave whatever each CTA does, so
// the repetition costs time only through the CTA's own length (the Gram products are about
// half of its multiply-adds; the first candidate for a later variant). One CTA needs
// ~124 KB of shared memory (DK = 128), within the 227 KB an H200 CTA may have.
//
// 256 threads = 8 warps. Phases per chunk, each with its own thread mapping:
//   load:   the chunk's k and q rows (padded to DK + 4: float4-aligned, and 16 rows at one
//           column fall in distinct banks), v's 32 columns, β, and G by a warp scan.
//   column: lane = column, warp w rows w + 8m: S0ᵀ k_i and S0ᵀ q_i → β R (over v) and the
//           outputs' inter-chunk part, kept in registers.
//   Gram:   thread (ti, tj) = rows ti + 16a, columns tj + 16b (a, b < 4) of A and of
//           M_ij = e^{G_i − G_j} (q_i · k_j) (j ≤ i, else 0).
//   solve:  warp w owns columns 4w..4w+3, 8 lanes per column split the sum over j; row by
//           row, with warp shuffles and no CTA barrier (a warp only reads its own columns).
//   output: o_i += Σ_j M_ij Δ_j, lane = column as in the column phase; written to out.
//   state:  lane = column, rows 32m + 4w + x: S ← e^{G_last} S + Σ_j e^{G_last − G_j} k_j Δ_jᵀ.
// Dynamic shared memory: delta_chunked_shared_floats(DK) floats (mirrored on the host).

#define DELTA_CHUNK_THREADS 256
#define DELTA_CHUNK_COLS 32

// The k / q row stride, the Δ row stride, and the shared floats of one CTA.
template <int DK>
static __device__ __host__ constexpr int delta_chunked_key_stride() {
    return DK + 4;
}
static __device__ __host__ constexpr int delta_chunked_delta_stride() {
    return DELTA_CHUNK_COLS + 4;
}
template <int DK, int CHUNK>
static __device__ __host__ constexpr int delta_chunked_shared_floats() {
    return 2 * CHUNK * delta_chunked_key_stride<DK>() + DK * DELTA_CHUNK_COLS +
           2 * CHUNK * CHUNK + CHUNK * delta_chunked_delta_stride() + 4 * CHUNK;
}

extern __shared__ float4 delta_chunked_shared[];

template <int DK, int CHUNK>
__global__ void __launch_bounds__(DELTA_CHUNK_THREADS)
delta_chunked_kernel(const float* __restrict__ qkv, const float* __restrict__ beta,
                     const float* __restrict__ g, float* __restrict__ state,
                     float* __restrict__ out, int tokens, int k_heads, int v_heads, int dv) {
    pdl_begin();
    constexpr int COLS = DELTA_CHUNK_COLS, WARPS = DELTA_CHUNK_THREADS / WARP_SIZE;
    constexpr int KS = delta_chunked_key_stride<DK>(), DS = delta_chunked_delta_stride();
    constexpr int ROWS = CHUNK / WARPS;          // column / output phases: rows per thread
    constexpr int TILE = CHUNK / 16;             // Gram phase: rows (and columns) per thread
    constexpr int SPLIT = WARP_SIZE / (COLS / WARPS);  // solve: lanes per column
    constexpr int STATE_GROUPS = DK / (4 * WARPS);     // state phase: 4-row groups per thread
    static_assert(CHUNK == 64 && DELTA_CHUNK_THREADS == 256, "thread mappings assume these");
    static_assert(DK % 32 == 0, "DK a multiple of 32");
    float* ks = reinterpret_cast<float*>(delta_chunked_shared);  // [CHUNK][KS]
    float* qs = ks + CHUNK * KS;                                 // [CHUNK][KS]
    float* s = qs + CHUNK * KS;                                  // [DK][COLS]
    float* a_mat = s + DK * COLS;                                // [CHUNK][CHUNK]
    float* m_mat = a_mat + CHUNK * CHUNK;                        // [CHUNK][CHUNK]
    float* d = m_mat + CHUNK * CHUNK;                            // [CHUNK][DS]: β R, then Δ
    float* cum = d + CHUNK * DS;                                 // G_i
    float* bs = cum + CHUNK;                                     // β_i
    float* eg = bs + CHUNK;                                      // e^{G_i}
    float* tail = eg + CHUNK;                                    // e^{G_last − G_i}

    const int h = blockIdx.x, col0 = blockIdx.y * COLS;
    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int kh = h / (v_heads / k_heads);
    const int key_dim = k_heads * DK, channels = 2 * key_dim + v_heads * dv;
    float* s_global = state + i64(h) * DK * dv + col0;
    for (int i = tid; i < DK * COLS; i += DELTA_CHUNK_THREADS) {
        s[i] = s_global[(i / COLS) * dv + i % COLS];
    }
    for (int start = 0; start < tokens; start += CHUNK) {
        const int n = min(CHUNK, tokens - start);
        __syncthreads();  // the previous chunk is done with every buffer
        for (int i = tid; i < CHUNK * DK; i += DELTA_CHUNK_THREADS) {
            const int r = i / DK, e = i % DK;
            float kv = 0.0f, qv = 0.0f;
            if (r < n) {
                const float* row = qkv + i64(start + r) * channels;
                qv = row[kh * DK + e];
                kv = row[key_dim + kh * DK + e];
            }
            ks[r * KS + e] = kv;
            qs[r * KS + e] = qv;
        }
        for (int i = tid; i < CHUNK * COLS; i += DELTA_CHUNK_THREADS) {
            const int r = i / COLS, j = i % COLS;
            d[r * DS + j] =
                r < n ? qkv[i64(start + r) * channels + 2 * key_dim + h * dv + col0 + j] : 0.0f;
        }
        if (warp == 0) {
            // Inclusive scan of g over the chunk, two rows per lane.
            float lo = lane < n ? g[(start + lane) * v_heads + h] : 0.0f;
            float hi = lane + WARP_SIZE < n ? g[(start + lane + WARP_SIZE) * v_heads + h] : 0.0f;
#pragma unroll
            for (int off = 1; off < WARP_SIZE; off <<= 1) {
                const float lo_up = __shfl_up_sync(0xffffffffu, lo, off);
                const float hi_up = __shfl_up_sync(0xffffffffu, hi, off);
                if (lane >= off) {
                    lo += lo_up;
                    hi += hi_up;
                }
            }
            hi += __shfl_sync(0xffffffffu, lo, WARP_SIZE - 1);
            cum[lane] = lo;
            cum[lane + WARP_SIZE] = hi;
            bs[lane] = lane < n ? beta[(start + lane) * v_heads + h] : 0.0f;
            bs[lane + WARP_SIZE] =
                lane + WARP_SIZE < n ? beta[(start + lane + WARP_SIZE) * v_heads + h] : 0.0f;
        }
        __syncthreads();
        if (tid < CHUNK) {
            eg[tid] = expf(cum[tid]);
            tail[tid] = expf(cum[n - 1] - cum[tid]);
        }
        // Column phase: S0ᵀ k_i and S0ᵀ q_i for rows warp + 8m of column `lane`.
        float o[ROWS];
        {
            float sk[ROWS];
#pragma unroll
            for (int m = 0; m < ROWS; ++m) o[m] = sk[m] = 0.0f;
            for (int e = 0; e < DK; e += 4) {
                const float s0 = s[e * COLS + lane], s1 = s[(e + 1) * COLS + lane];
                const float s2 = s[(e + 2) * COLS + lane], s3 = s[(e + 3) * COLS + lane];
#pragma unroll
                for (int m = 0; m < ROWS; ++m) {
                    const int r = warp + WARPS * m;
                    const float4 k4 = *reinterpret_cast<const float4*>(ks + r * KS + e);
                    const float4 q4 = *reinterpret_cast<const float4*>(qs + r * KS + e);
                    sk[m] += k4.x * s0 + k4.y * s1 + k4.z * s2 + k4.w * s3;
                    o[m] += q4.x * s0 + q4.y * s1 + q4.z * s2 + q4.w * s3;
                }
            }
#pragma unroll
            for (int m = 0; m < ROWS; ++m) {
                const int r = warp + WARPS * m;
                const float decay = expf(cum[r]);
                o[m] *= decay;
                d[r * DS + lane] = bs[r] * (d[r * DS + lane] - decay * sk[m]);
            }
        }
        // Gram phase: A and M for rows ti + 16a, columns tj + 16b.
        {
            const int ti = tid / 16, tj = tid % 16;
            float kk[TILE][TILE], qk[TILE][TILE];
#pragma unroll
            for (int a = 0; a < TILE; ++a) {
#pragma unroll
                for (int b = 0; b < TILE; ++b) kk[a][b] = qk[a][b] = 0.0f;
            }
            for (int e = 0; e < DK; e += 4) {
                float4 ki[TILE], qi[TILE], kj[TILE];
#pragma unroll
                for (int a = 0; a < TILE; ++a) {
                    ki[a] = *reinterpret_cast<const float4*>(ks + (ti + 16 * a) * KS + e);
                    qi[a] = *reinterpret_cast<const float4*>(qs + (ti + 16 * a) * KS + e);
                    kj[a] = *reinterpret_cast<const float4*>(ks + (tj + 16 * a) * KS + e);
                }
#pragma unroll
                for (int a = 0; a < TILE; ++a) {
#pragma unroll
                    for (int b = 0; b < TILE; ++b) {
                        kk[a][b] += ki[a].x * kj[b].x + ki[a].y * kj[b].y + ki[a].z * kj[b].z +
                                    ki[a].w * kj[b].w;
                        qk[a][b] += qi[a].x * kj[b].x + qi[a].y * kj[b].y + qi[a].z * kj[b].z +
                                    qi[a].w * kj[b].w;
                    }
                }
            }
#pragma unroll
            for (int a = 0; a < TILE; ++a) {
#pragma unroll
                for (int b = 0; b < TILE; ++b) {
                    const int i = ti + 16 * a, j = tj + 16 * b;
                    // Only j ≤ i: e^{G_i − G_j} ≤ 1 there, and above it may overflow.
                    const float decay = j <= i ? expf(cum[i] - cum[j]) : 0.0f;
                    a_mat[i * CHUNK + j] = j < i ? bs[i] * decay * kk[a][b] : 0.0f;
                    m_mat[i * CHUNK + j] = decay * qk[a][b];
                }
            }
        }
        __syncthreads();
        // Solve (I + A) Δ = β R in place, row by row: warp-local, 8 lanes per column.
        {
            const int col = warp * (COLS / WARPS) + lane / SPLIT, part = lane % SPLIT;
            for (int i = 1; i < n; ++i) {
                float sum = 0.0f;
                for (int j = part; j < i; j += SPLIT) sum += a_mat[i * CHUNK + j] * d[j * DS + col];
#pragma unroll
                for (int off = SPLIT / 2; off > 0; off >>= 1) {
                    sum += __shfl_xor_sync(0xffffffffu, sum, off);
                }
                if (part == 0) d[i * DS + col] -= sum;
                __syncwarp();
            }
        }
        __syncthreads();
        // Output phase: o_i += Σ_{j≤i} M_ij Δ_j (M is zero above the diagonal, Δ past n).
        for (int j = 0; j < n; j += 4) {
            const float d0 = d[j * DS + lane], d1 = d[(j + 1) * DS + lane];
            const float d2 = d[(j + 2) * DS + lane], d3 = d[(j + 3) * DS + lane];
#pragma unroll
            for (int m = 0; m < ROWS; ++m) {
                const int r = warp + WARPS * m;
                const float4 m4 = *reinterpret_cast<const float4*>(m_mat + r * CHUNK + j);
                o[m] += m4.x * d0 + m4.y * d1 + m4.z * d2 + m4.w * d3;
            }
        }
#pragma unroll
        for (int m = 0; m < ROWS; ++m) {
            const int r = warp + WARPS * m;
            if (r < n) out[(i64(start + r) * v_heads + h) * dv + col0 + lane] = o[m];
        }
        // State phase: rows 32 g + 4 warp + x of column `lane`.
        {
            float acc[STATE_GROUPS][4];
            const float decay = eg[n - 1];
#pragma unroll
            for (int gi = 0; gi < STATE_GROUPS; ++gi) {
#pragma unroll
                for (int x = 0; x < 4; ++x) {
                    acc[gi][x] = s[(32 * gi + 4 * warp + x) * COLS + lane] * decay;
                }
            }
            for (int j = 0; j < n; ++j) {
                const float dj = d[j * DS + lane] * tail[j];
#pragma unroll
                for (int gi = 0; gi < STATE_GROUPS; ++gi) {
                    const float4 k4 =
                        *reinterpret_cast<const float4*>(ks + j * KS + 32 * gi + 4 * warp);
                    acc[gi][0] += k4.x * dj;
                    acc[gi][1] += k4.y * dj;
                    acc[gi][2] += k4.z * dj;
                    acc[gi][3] += k4.w * dj;
                }
            }
#pragma unroll
            for (int gi = 0; gi < STATE_GROUPS; ++gi) {
#pragma unroll
                for (int x = 0; x < 4; ++x) s[(32 * gi + 4 * warp + x) * COLS + lane] = acc[gi][x];
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < DK * COLS; i += DELTA_CHUNK_THREADS) {
        s_global[(i / COLS) * dv + i % COLS] = s[i];
    }
}
