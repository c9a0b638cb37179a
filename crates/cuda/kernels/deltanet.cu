// The Gated DeltaNet mixer between its projections (spec §3.2 steps 2-6): legacy split,
// causal conv + SiLU, L2-normalized q/k and gates, the recurrent delta rule, gated RMSNorm.
// Shapes (outermost first): qkv [T][channels] = q [k_heads][dk] | k [k_heads][dk] |
// v [v_heads][dv]; z, o [T][v_heads][dv]; ba [T][k_heads][2 r] ([b × r, a × r], r =
// v_heads / k_heads); beta, g [T][v_heads]; conv state [kernel - 1][channels]; recurrent
// state [v_heads][dk][dv]. Needs the prelude and reduce.cuh.

// Legacy `ssm_in` output p [T][channels + inner] (per key group [q k v… z…]) to qkv and z.
__global__ void deltanet_split_kernel(const float* __restrict__ p, float* __restrict__ qkv,
                                      float* __restrict__ z, int k_heads, int dk, int r, int dv) {
    pdl_begin();
    const int t = blockIdx.y;
    const int key_dim = k_heads * dk, inner = k_heads * r * dv;
    const int channels = 2 * key_dim + inner, width = channels + inner;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const int group = 2 * dk + 2 * r * dv;
    const int g = i / group, o = i % group;
    const float value = p[i64(t) * width + i];
    float* q_row = qkv + i64(t) * channels;
    if (o < dk) {
        q_row[g * dk + o] = value;
    } else if (o < 2 * dk) {
        q_row[key_dim + g * dk + (o - dk)] = value;
    } else if (o < 2 * dk + r * dv) {
        q_row[2 * key_dim + g * r * dv + (o - 2 * dk)] = value;
    } else {
        z[i64(t) * inner + g * r * dv + (o - 2 * dk - r * dv)] = value;
    }
}

// Channel c of tokens t0..t1 in order, in place: out_t = silu(Σ_j taps[j] window[j]) over the
// window of the KERNEL - 1 raw inputs before t and the raw input t; `window` slides along.
template <int KERNEL>
static __device__ __forceinline__ void conv_silu_range(float* __restrict__ qkv,
                                                       float (&window)[KERNEL],
                                                       const float (&taps)[KERNEL], int channels,
                                                       int c, int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
        float* x = qkv + i64(t) * channels + c;
        window[KERNEL - 1] = *x;
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < KERNEL; ++j) acc += taps[j] * window[j];
        *x = siluf(acc);
#pragma unroll
        for (int j = 0; j < KERNEL - 1; ++j) window[j] = window[j + 1];
    }
}

// One thread per channel, tokens in order: out_t = silu(Σ_j w[c][j] window[j]) over the
// window [conv state; raw inputs], written over qkv in place; the state keeps the last
// KERNEL - 1 raw inputs.
template <int KERNEL>
__global__ void conv_silu_kernel(float* __restrict__ qkv, float* __restrict__ state,
                                 const float* __restrict__ w, int channels, int tokens) {
    pdl_begin();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= channels) return;
    float window[KERNEL], taps[KERNEL];
#pragma unroll
    for (int j = 0; j < KERNEL; ++j) taps[j] = w[c * KERNEL + j];
#pragma unroll
    for (int j = 0; j < KERNEL - 1; ++j) window[j] = state[j * channels + c];
    conv_silu_range<KERNEL>(qkv, window, taps, channels, c, 0, tokens);
#pragma unroll
    for (int j = 0; j < KERNEL - 1; ++j) state[j * channels + c] = window[j];
}

// conv_silu_kernel with the tokens split, for prompts: one CTA per 32 channels, thread
// (row, lane) takes channel 32 · blockIdx.x + lane and the row-th range of ceil(T / rows)
// tokens. Before a barrier every thread reads the KERNEL - 1 raw inputs in front of its range
// (qkv rows, or the conv state before token 0) and row 0 the last KERNEL - 1 raw inputs of
// the call (the new state); after it each thread overwrites only its own range, so no raw
// input is read once replaced. Taps and sum order are conv_silu_kernel's: the same bits.
template <int KERNEL>
__global__ void __launch_bounds__(1024)
conv_silu_tokens_kernel(float* __restrict__ qkv, float* __restrict__ state,
                        const float* __restrict__ w, int channels, int tokens) {
    pdl_begin();
    const int lane = threadIdx.x % WARP_SIZE, row = threadIdx.x / WARP_SIZE;
    const int rows = blockDim.x / WARP_SIZE;
    const int c = blockIdx.x * WARP_SIZE + lane;
    const bool live = c < channels;
    const int per_row = (tokens + rows - 1) / rows;
    const int t0 = min(tokens, row * per_row), t1 = min(tokens, t0 + per_row);
    // The raw input at position p of the window [conv state; qkv] (p < 0: the state).
    auto raw = [&](int p) {
        return p < 0 ? state[(KERNEL - 1 + p) * channels + c] : qkv[i64(p) * channels + c];
    };
    float window[KERNEL], taps[KERNEL], tail[KERNEL - 1];
    if (live) {
#pragma unroll
        for (int j = 0; j < KERNEL; ++j) taps[j] = w[c * KERNEL + j];
#pragma unroll
        for (int j = 0; j < KERNEL - 1; ++j) window[j] = raw(t0 - (KERNEL - 1) + j);
        if (row == 0) {
#pragma unroll
            for (int j = 0; j < KERNEL - 1; ++j) tail[j] = raw(tokens - (KERNEL - 1) + j);
        }
    }
    __syncthreads();
    if (!live) return;
    conv_silu_range<KERNEL>(qkv, window, taps, channels, c, t0, t1);
    if (row == 0) {
#pragma unroll
        for (int j = 0; j < KERNEL - 1; ++j) state[j * channels + c] = tail[j];
    }
}

// One CTA per token: each q and k head of qkv L2-normalized in place (x · rsqrt(Σx² + eps)),
// q then scaled by q_scale; per v-head β = sigmoid(b), g = a · softplus(a_in + dt_bias).
__global__ void deltanet_prep_kernel(float* __restrict__ qkv, const float* __restrict__ ba,
                                     const float* __restrict__ a, const float* __restrict__ dt_bias,
                                     float* __restrict__ beta, float* __restrict__ g,
                                     int channels, int k_heads, int v_heads, int dk, float eps,
                                     float q_scale) {
    pdl_begin();
    const int t = blockIdx.x;
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int warps = blockDim.x / WARP_SIZE;
    float* row = qkv + i64(t) * channels;
    for (int h = warp; h < 2 * k_heads; h += warps) {
        float* x = row + h * dk;
        float ss = 0.0f;
        for (int i = lane; i < dk; i += WARP_SIZE) ss += x[i] * x[i];
        ss = warp_reduce_sum(ss);
        const float scale = 1.0f / sqrtf(ss + eps);
        for (int i = lane; i < dk; i += WARP_SIZE) {
            const float v = x[i] * scale;
            x[i] = h < k_heads ? v * q_scale : v;
        }
    }
    const int r = v_heads / k_heads;
    for (int h = threadIdx.x; h < v_heads; h += blockDim.x) {
        const int base = t * 2 * v_heads + 2 * r * (h / r);
        const float b_in = ba[base + h % r], a_in = ba[base + r + h % r] + dt_bias[h];
        const float softplus = a_in > 20.0f ? a_in : log1pf(expf(a_in));
        beta[t * v_heads + h] = sigmoidf(b_in);
        g[t * v_heads + h] = a[h] * softplus;
    }
}

// The recurrent delta rule, tokens in order. Grid (v_heads, dv / COLS), COLS threads; thread
// j owns column j of the head's state (DK rows, in registers) — columns are independent:
// S ← αS; δ_j = β (v_j − Σ_i S_ij k_i); S_ij += k_i δ_j; o_j = Σ_i S_ij q_i. V-head h reads
// q/k head h / (v_heads / k_heads).
template <int DK, int COLS>
__global__ void __launch_bounds__(COLS)
delta_rule_kernel(const float* __restrict__ qkv, const float* __restrict__ beta,
                  const float* __restrict__ g, float* __restrict__ state, float* __restrict__ out,
                  int tokens, int k_heads, int v_heads, int dv) {
    pdl_begin();
    __shared__ float qs[DK], ks[DK];
    const int h = blockIdx.x, j = blockIdx.y * COLS + threadIdx.x;
    const int kh = h / (v_heads / k_heads);
    const int key_dim = k_heads * DK, channels = 2 * key_dim + v_heads * dv;
    float* s = state + i64(h) * DK * dv + j;
    float col[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = s[i * dv];
    for (int t = 0; t < tokens; ++t) {
        const float* row = qkv + i64(t) * channels;
        for (int i = threadIdx.x; i < DK; i += COLS) {
            qs[i] = row[kh * DK + i];
            ks[i] = row[key_dim + kh * DK + i];
        }
        __syncthreads();
        const float alpha = expf(g[t * v_heads + h]), b = beta[t * v_heads + h];
        float delta = row[2 * key_dim + h * dv + j];
#pragma unroll
        for (int i = 0; i < DK; ++i) {
            col[i] *= alpha;
            delta -= col[i] * ks[i];
        }
        delta *= b;
        float o = 0.0f;
#pragma unroll
        for (int i = 0; i < DK; ++i) {
            col[i] += ks[i] * delta;
            o += col[i] * qs[i];
        }
        out[(i64(t) * v_heads + h) * dv + j] = o;
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < DK; ++i) s[i * dv] = col[i];
}

// One warp per (token, v-head) row of o: o ← RMSNorm(o) · w · silu(z), WARPS rows per CTA.
template <int WARPS>
__global__ void gated_norm_kernel(float* __restrict__ o, const float* __restrict__ z,
                                  const float* __restrict__ w, int rows, int dv, float eps) {
    pdl_begin();
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= rows) return;
    float* x = o + i64(row) * dv;
    const float* zr = z + i64(row) * dv;
    float ss = 0.0f;
    for (int i = lane; i < dv; i += WARP_SIZE) ss += x[i] * x[i];
    ss = warp_reduce_sum(ss);
    const float scale = 1.0f / sqrtf(ss / float(dv) + eps);
    for (int i = lane; i < dv; i += WARP_SIZE) x[i] = x[i] * scale * w[i] * siluf(zr[i]);
}

// Four consecutive floats of shared memory (16-byte aligned), read where the call stands: an
// asm volatile load the compiler neither hoists nor merges with another read of the same
// address. Plain reads of the step's 2 x 128 key and query values were kept in registers
// from the first loop to the second beside the 128-float state column, and spilled it to
// local memory (ptxas: 404 bytes spilled a thread). AGAIN: a volatile load, which ptxas does
// not merge with an earlier load of the same address either (the replay's second loop would
// otherwise keep the first loop's key values beside the state column, and spill it).
template <bool AGAIN = false>
static __device__ __forceinline__ float4 shared_load4(const float* p) {
    float4 v;
    const u32 address = u32(__cvta_generic_to_shared(p));
    if constexpr (AGAIN) {
        asm volatile("ld.volatile.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(address));
    } else {
        asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(address));
    }
    return v;
}

// The first half of a delta-rule row, shared by the step and its replay so that both run
// the same operations in the same order: each state value decays by alpha, then the row's
// value minus the decayed column's projection on k (k four values at a time through
// shared_load4<AGAIN>, in order). Returns that difference; the caller scales it by beta.
template <int DK, bool AGAIN = false>
static __device__ __forceinline__ float decay_and_project(float (&col)[DK], const float* k,
                                                          float alpha, float value) {
    float delta = value;
#pragma unroll
    for (int i = 0; i < DK; i += 4) {
        const float4 k4 = shared_load4<AGAIN>(k + i);
        const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            col[i + u] *= alpha;
            delta -= col[i + u] * kv[u];
        }
    }
    return delta;
}

// A conv channel of the fused step below: its taps and the window of its last KERNEL - 1
// raw inputs, carried in registers from row to row.
template <int KERNEL>
struct ConvChannel {
    int ch;
    float taps[KERNEL], window[KERNEL - 1];
};

// Taps and state of channel ch (ch < 0: none, nothing loaded).
template <int KERNEL>
static __device__ __forceinline__ ConvChannel<KERNEL> conv_channel(
    int ch, const float* __restrict__ conv_w, const float* __restrict__ conv_state, int channels) {
    ConvChannel<KERNEL> c;
    c.ch = ch;
    if (ch >= 0) {
#pragma unroll
        for (int q = 0; q < KERNEL; ++q) c.taps[q] = conv_w[ch * KERNEL + q];
#pragma unroll
        for (int q = 0; q < KERNEL - 1; ++q) c.window[q] = conv_state[q * channels + ch];
    }
    return c;
}

// threadIdx.x and blockIdx.x as read now: asm volatile, so that the compiler neither reuses
// an earlier read nor moves this one (deltanet_replay.cu reads blockIdx.y so too).
static __device__ __forceinline__ int fresh_thread_index() {
    int v;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
    return v;
}

static __device__ __forceinline__ int fresh_block_index() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(v));
    return v;
}

// Floats of one row of the step's replay inputs (deltanet_step_kernel's replay_rows).
static __device__ __forceinline__ i64 deltanet_replay_row_floats(int dk, int k_heads,
                                                                 int v_heads) {
    return i64(k_heads + v_heads) * dk + 2 * v_heads;
}

// The whole DeltaNet step of `tokens` tokens (decode: one; an MTP verification: a few) in
// one launch: conv + SiLU, q/k L2 norms, β and g, the delta rule and the gated RMSNorm, each
// as the kernels above compute it. Thread (v, j) owns value column j of v-head
// h = kh * r + v (r = v_heads / k_heads; dk = dv = DK): its conv channel, its state column (DK
// floats in registers across the rows) and its output. A row's arithmetic does not depend on
// the rows before it other than through the state (and the conv window), so row t of one
// launch gives the bits of a one-row launch on the state after row t - 1.
// The rows go in groups of G (tokens a multiple of G; the launcher takes 2 for an even number
// of rows, else 1): a group's raw inputs are loaded and convolved, its q and k normalized
// and its gates computed for all its rows behind the same three barriers; then the delta
// rule runs row after row, the only chain between rows; then the gated norms of all its rows
// share one barrier. Each value is the same expression on the same operands as row by row,
// so the same bits: only the order in which independent work issues changes (an MTP
// verification paid the whole chain of loads and barriers once a row). A group of 3 or 4
// rows is launched only for a batch of exactly that many (one group: the row count is then
// G, known at compile time, so the conv windows die after the convs) and its delta rule
// runs the rows in a loop with their gates from shared memory, the final state stored after
// it: unrolled, or with a runtime count, those groups spilled the state column (ptxas, sm_90,
// DK = 128). No partial group is built.
// One CTA per key head, r * DK threads; the head's 2 DK q and k channels are convolved by the
// first 2 DK threads, each conv channel read and written by one thread. (A layout of one CTA
// per value head, a key head's value heads one thread-block cluster so that their states
// load and store through r multiprocessors, measured no faster: H100, twenty-ninth session.)
// Per row: qkv, the projections before the conv [channels]; z [v_heads][DK]; ba
// [k_heads][2 r]; out [v_heads][DK]. With conv_rec, the conv window after each row but the
// last is kept: conv_rec [tokens - 1][KERNEL - 1][channels]; beside it either state_rec, the
// state after each row but the last ([tokens - 1][v_heads][DK][DK]), or snapshot and
// replay_rows: the state before the step ([v_heads][DK][DK]) and each row's delta-rule inputs
// but the last's ([tokens - 1] rows of `deltanet_replay_row_floats`: normalized k [k_heads][DK],
// the value after the conv [v_heads][DK], α [v_heads], β [v_heads]), from which
// deltanet_replay_kernel rebuilds the state after any row. The snapshot is stored before the
// PDL wait, where its stores drain while the previous kernel runs, instead of a record's
// stores between the rows. With od and oq (r x DK = 256 only), each row's
// output also in Q8_K: od [tokens][k_heads] scales, oq [tokens][v_heads][DK] codes.
// Dynamic shared memory: none. At most 256 threads,
// so that the DK-float state column stays in registers (a 1024-thread bound caps them at 64
// and spills it).
// Before the PDL wait each thread loads, beside its state column, the taps and the conv state
// of its channels (conv_state and conv_w are this layer's, written by nothing the wait is
// for), and carries each window in registers from row to row; after the wait a row's conv
// reads only its raw inputs. The conv state is stored once, after the last row. The last
// row's state column is stored as soon as it is final, so that the stores drain while the
// gated norm and the quantization run.
template <int DK, int KERNEL, int G>
__global__ void __launch_bounds__(256)
deltanet_step_kernel(const float* __restrict__ qkv, const float* __restrict__ z,
                     const float* __restrict__ ba, const float* __restrict__ conv_w,
                     float* __restrict__ conv_state, const float* __restrict__ a,
                     const float* __restrict__ dt_bias, const float* __restrict__ norm_w,
                     float* __restrict__ state, float* __restrict__ out,
                     float* __restrict__ conv_rec, float* __restrict__ state_rec,
                     float* __restrict__ snapshot, float* __restrict__ replay_rows,
                     float* __restrict__ od, i8* __restrict__ oq, int row_count, int k_heads,
                     int v_heads, float eps, float q_scale) {
    PROBE_RETURN(PROBE_STEP);
    // A group of 3 or more rows is launched for a batch of exactly that many rows (one
    // group): the count known here, so each row's conv window dies after its conv.
    const int tokens = G >= 3 ? G : row_count;
    __shared__ __align__(16) float qs[G][DK], ks[G][DK];
    __shared__ float4 o_stage[G][64];
    __shared__ float scale_qk[G][2];
    __shared__ float head_ss[G][32];
    // Groups of 3 or more rows: each row's gates by value head (256 / DK a CTA at most).
    __shared__ float gate_alpha[G >= 3 ? G : 1][256 / DK], gate_beta[G >= 3 ? G : 1][256 / DK];
    // Each row's z, conv output of the thread's value channel and delta-rule output, by
    // thread: in registers beside the state column they spill it.
    __shared__ float row_z[G][256], row_value[G][256], row_o[G][256];
    // A replay's inputs of the first REPLAY_ROWS rows, kept here while the state column is
    // live and stored after the last row (stores of them among the rows spilled the column:
    // ptxas, sm_90, DK = 128).
    constexpr int REPLAY_ROWS = 3;
    __shared__ float replay_k[REPLAY_ROWS][DK], replay_v[REPLAY_ROWS][256];
    const int kh = blockIdx.x, tid = threadIdx.x;
    const int warp = tid / WARP_SIZE, lane = tid % WARP_SIZE, warps = blockDim.x / WARP_SIZE;
    const int r = v_heads / k_heads;
    const int key_dim = k_heads * DK, channels = 2 * key_dim + v_heads * DK;
    const int inner = v_heads * DK;
    const int v = tid / DK, j = tid % DK, h = kh * r + v;
    float* s = state + i64(h) * DK * DK + j;
    float col[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = s[i * DK];
    // This thread's gate inputs, z and norm weight are loaded before the conv, so that their
    // latency overlaps it instead of following the barriers.
    const float a_h = a[h], dt_h = dt_bias[h], norm_wj = norm_w[j];
    // The thread's conv channels: at most two of the key head's 2 DK q and k channels (r DK
    // >= DK threads) and its value channel.
    const auto qk_channel = [&](int c) {
        return c < 2 * DK ? (c < DK ? kh * DK + c : key_dim + kh * DK + c - DK) : -1;
    };
    ConvChannel<KERNEL> conv_qk[2] = {
        conv_channel<KERNEL>(qk_channel(tid), conv_w, conv_state, channels),
        conv_channel<KERNEL>(qk_channel(tid + int(blockDim.x)), conv_w, conv_state, channels)};
    ConvChannel<KERNEL> conv_v =
        conv_channel<KERNEL>(2 * key_dim + h * DK + j, conv_w, conv_state, channels);
    // The state before the step, for a rollback: nothing reads the snapshot until the
    // replay launched after this step's graph, so it is stored before the wait too.
    if (snapshot != nullptr) {
        float* kept = snapshot + i64(h) * DK * DK + j;
#pragma unroll
        for (int i = 0; i < DK; ++i) kept[i * DK] = col[i];
    }
    // Under PDL all of the above is loaded while the previous kernel still runs: the states are
    // this layer's, written by this kernel alone (and by copies launches before it).
    pdl_begin();
    // The channel's window slides by row t's raw input x, in registers, into the row's record
    // (all rows but the last) and, after the last row, into the conv state.
    const auto conv = [&](ConvChannel<KERNEL>& c, const float* x, int t) {
        float window[KERNEL];
#pragma unroll
        for (int q = 0; q < KERNEL - 1; ++q) window[q] = c.window[q];
        window[KERNEL - 1] = x[c.ch];
        float acc = 0.0f;
#pragma unroll
        for (int q = 0; q < KERNEL; ++q) acc += c.taps[q] * window[q];
#pragma unroll
        for (int q = 0; q < KERNEL - 1; ++q) c.window[q] = window[q + 1];
        if (t + 1 == tokens) {
#pragma unroll
            for (int q = 0; q < KERNEL - 1; ++q) conv_state[q * channels + c.ch] = window[q + 1];
        } else if (conv_rec != nullptr) {
            float* rec = conv_rec + i64(t) * (KERNEL - 1) * channels;
#pragma unroll
            for (int q = 0; q < KERNEL - 1; ++q) rec[q * channels + c.ch] = window[q + 1];
        }
        return siluf(acc);
    };
    for (int t0 = 0; t0 < tokens; t0 += G) {
        float beta[G], alpha[G];
        // Each row's raw inputs, convolutions and gates.
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const int t = t0 + g;
            const float* x = qkv + i64(t) * channels;
            const float* bar = ba + i64(t) * 2 * v_heads;
            const float b_in = bar[2 * r * kh + v], a_raw = bar[2 * r * kh + r + v];
            row_z[g][tid] = z[i64(t) * inner + h * DK + j];
#pragma unroll
            for (int u = 0; u < 2; ++u) {
                const int c = tid + u * int(blockDim.x);
                if (c < 2 * DK) {
                    const float y = conv(conv_qk[u], x, t);
                    if (c < DK) {
                        qs[g][c] = y;
                    } else {
                        ks[g][c - DK] = y;
                    }
                }
            }
            const float value = conv(conv_v, x, t);
            row_value[g][tid] = value;
            const float a_in = a_raw + dt_h;
            const float softplus = a_in > 20.0f ? a_in : log1pf(expf(a_in));
            beta[g] = sigmoidf(b_in);
            alpha[g] = expf(a_h * softplus);
            if constexpr (G >= 3) {
                if (j == 0) gate_beta[g][v] = beta[g], gate_alpha[g][v] = alpha[g];
            }
            if (t < REPLAY_ROWS) replay_v[t][tid] = value;
        }
        __syncthreads();
        // The L2 norms of the group's q and k rows, a warp each.
        for (int which = warp; which < 2 * G; which += warps) {
            const int g = which / 2;
            const float* y = which % 2 == 0 ? qs[g] : ks[g];
            float ss = 0.0f;
            for (int i = lane; i < DK; i += WARP_SIZE) ss += y[i] * y[i];
            ss = warp_reduce_sum(ss);
            if (lane == 0) scale_qk[g][which % 2] = 1.0f / sqrtf(ss + eps);
        }
        __syncthreads();
        for (int e = tid; e < 2 * DK * G; e += blockDim.x) {
            const int g = e / (2 * DK), c = e % (2 * DK);
            if (c < DK) {
                qs[g][c] = qs[g][c] * scale_qk[g][0] * q_scale;
            } else {
                const float k = ks[g][c - DK] * scale_qk[g][1];
                ks[g][c - DK] = k;
                if (t0 + g < REPLAY_ROWS) replay_k[t0 + g][c - DK] = k;
            }
        }
        __syncthreads();
        // The delta rule, row after row: ks and qs four at a time through shared_load4, where
        // they are used (the same operations in the same order as element by element).
        // Three or more rows go one after another (unrolled they spill the state column),
        // their gates read back from shared memory.
#pragma unroll(G >= 3 ? 1 : G)
        for (int g = 0; g < G; ++g) {
            const int t = t0 + g;
            const float row_alpha = G >= 3 ? gate_alpha[g][v] : alpha[g];
            const float row_beta = G >= 3 ? gate_beta[g][v] : beta[g];
            float delta = decay_and_project(col, ks[g], row_alpha, row_value[g][tid]);
            delta *= row_beta;
            float og = 0.0f;
#pragma unroll
            for (int i = 0; i < DK; i += 4) {
                const float4 k4 = shared_load4(ks[g] + i), q4 = shared_load4(qs[g] + i);
                const float kv[4] = {k4.x, k4.y, k4.z, k4.w}, qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    col[i + u] += kv[u] * delta;
                    og += col[i + u] * qv[u];
                }
            }
            row_o[g][tid] = og;
            if (state_rec != nullptr && t + 1 < tokens) {
                float* rec = state_rec + i64(t) * v_heads * DK * DK + i64(h) * DK * DK + j;
#pragma unroll
                for (int i = 0; i < DK; ++i) rec[i * DK] = col[i];
            }
            if (G < 3 && t + 1 == tokens) {
#pragma unroll
                for (int i = 0; i < DK; ++i) s[i * DK] = col[i];
            }
        }
        if constexpr (G >= 3) {
            // The rows' loop ended on the batch's last row (one group of all the rows).
#pragma unroll
            for (int i = 0; i < DK; ++i) s[i * DK] = col[i];
        }
        // Gated RMSNorm over the DK columns of head h (DK / 32 whole warps), every row's sums
        // of squares behind one barrier.
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const float ss = warp_reduce_sum(row_o[g][tid] * row_o[g][tid]);
            if (lane == 0) head_ss[g][warp] = ss;
        }
        __syncthreads();
#pragma unroll
        for (int g = 0; g < G; ++g) {
            const int t = t0 + g;
            float total = 0.0f;
            for (int w = v * (DK / WARP_SIZE); w < (v + 1) * (DK / WARP_SIZE); ++w) {
                total += head_ss[g][w];
            }
            const float norm = 1.0f / sqrtf(total / float(DK) + eps);
            const float result = row_o[g][tid] * norm * norm_wj * siluf(row_z[g][tid]);
            out[i64(t) * inner + h * DK + j] = result;
            // The CTA's r x DK = 256 outputs are Q8_K block kh of the row: staged for the
            // quantization below.
            if (oq != nullptr) reinterpret_cast<float*>(o_stage[g])[tid] = result;
        }
        if (oq != nullptr) {
            // Quantized here for the output projection (its codes, the same bits).
            __syncthreads();
            for (int g = 0; g < G; ++g) {
                const int t = t0 + g;
                const float* staged = reinterpret_cast<const float*>(o_stage[g]);
                quantize_q8k_blocks([=](int) { return staged; }, 1, od + i64(t) * k_heads + kh,
                                    oq + i64(t) * inner + kh * Q8K_VALUES);
            }
        }
        // The group's shared rows are rewritten by the next group.
        __syncthreads();
    }
    if (replay_rows != nullptr) {
        // The thread's indices read again, not kept from the top: values used here and before
        // the rows stay live across them, beside the state column, and spilled it.
        const int me = fresh_thread_index(), head = fresh_block_index();
        const int vh = head * (v_heads / k_heads) + me / DK, col_j = me % DK;
        const int keys = k_heads * DK;
        for (int t = 0; t + 1 < tokens && t < REPLAY_ROWS; ++t) {
            float* kept = replay_rows + i64(t) * deltanet_replay_row_floats(DK, k_heads, v_heads);
            if (me < DK) kept[head * DK + me] = replay_k[t][me];
            kept[keys + vh * DK + col_j] = replay_v[t][me];
            if (col_j == 0) {
                // The gates again, from the row's inputs by the same expressions as above.
                const float* bar = ba + i64(t) * 2 * v_heads;
                const int r = v_heads / k_heads, v = me / DK;
                const float b_in = bar[2 * r * head + v], a_raw = bar[2 * r * head + r + v];
                const float a_in = a_raw + dt_bias[vh];
                const float softplus = a_in > 20.0f ? a_in : log1pf(expf(a_in));
                kept[keys + v_heads * DK + vh] = expf(a[vh] * softplus);
                kept[keys + v_heads * DK + v_heads + vh] = sigmoidf(b_in);
            }
        }
    }
}
