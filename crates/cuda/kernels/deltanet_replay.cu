// The MTP rollback replayed (deltanet_step_kernel keeps the state before a verification and
// its rows' delta-rule inputs; this rebuilds the state after any kept row). Needs deltanet.cu
// before it (decay_and_project, shared_load4, deltanet_replay_row_floats).

// blockIdx.y as read now (as fresh_block_index, deltanet.cu).
static __device__ __forceinline__ int fresh_block_y() {
    int v;
    asm volatile("mov.u32 %0, %%ctaid.y;" : "=r"(v));
    return v;
}

// An MTP rollback of every DeltaNet layer at once to the state after row `kept` - 1 of the
// verification: each layer's snapshot (the state before the step) with rows 0 .. kept - 1 of
// the delta rule applied again from the inputs deltanet_step_kernel kept (normalized k, the
// value after the conv, α, β), the same operations in the same order as the step, so the bits
// of its state after that row; and the conv window after that row copied from its record.
// Grid (v_heads, layers), DK threads: thread j owns column j of value head blockIdx.x.
// layers[5 l ..]: layer l's snapshot, replay rows, state, conv record and conv state
// addresses; conv_len = (KERNEL - 1) x channels.
template <int DK>
__global__ void __launch_bounds__(DK)
deltanet_replay_kernel(const u64* __restrict__ layers, int kept, int k_heads, int v_heads,
                       int conv_len) {
    pdl_begin();
    __shared__ __align__(16) float ks[DK];
    const int h = blockIdx.x, j = threadIdx.x, kh = h / (v_heads / k_heads);
    const u64* at = layers + 5 * i64(blockIdx.y);
    const float* snapshot = reinterpret_cast<const float*>(at[0]) + i64(h) * DK * DK + j;
    const float* rows = reinterpret_cast<const float*>(at[1]);
    const int key_dim = k_heads * DK, inner = v_heads * DK;
    float col[DK];
#pragma unroll
    for (int i = 0; i < DK; ++i) col[i] = snapshot[i * DK];
#pragma unroll 1
    for (int t = 0; t < kept; ++t) {
        const float* row = rows + i64(t) * deltanet_replay_row_floats(DK, k_heads, v_heads);
        ks[j] = row[kh * DK + j];
        __syncthreads();
        const float alpha = row[key_dim + inner + h], beta = row[key_dim + inner + v_heads + h];
        float delta = decay_and_project<DK, true>(col, ks, alpha, row[key_dim + h * DK + j]);
        delta *= beta;
#pragma unroll
        for (int i = 0; i < DK; i += 4) {
            const float4 k4 = shared_load4<true>(ks + i);
            const float kv[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
            for (int u = 0; u < 4; ++u) col[i + u] += kv[u] * delta;
        }
        // ks is rewritten by the next row.
        __syncthreads();
    }
    // The table read again here: its addresses kept from the top stay live beside the column.
    const u64* again = layers + 5 * i64(fresh_block_y());
    float* state = reinterpret_cast<float*>(again[2]) + i64(h) * DK * DK + j;
#pragma unroll
    for (int i = 0; i < DK; ++i) state[i * DK] = col[i];
    const float* conv_rec = reinterpret_cast<const float*>(again[3]);
    float* conv_state = reinterpret_cast<float*>(again[4]);
    const float* window = conv_rec + i64(kept - 1) * conv_len;
    for (int c = h * DK + j; c < conv_len; c += v_heads * DK) conv_state[c] = window[c];
}
