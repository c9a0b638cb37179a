//! Device memory of one forward call's activations, mirroring what the CUDA backend
//! allocates: the forward `Workspace` (`x`, `h`, `mix`, each `[rows][n_embd]`), the
//! backend's `Scratch` (`backend/cuda/scratch.rs`: one buffer per intermediate, each
//! `[rows][width]`), its small-batch flash-decoding partials and its logits rows.
//! When either of those files gains a buffer, this file gains the same line.

use serde::Serialize;

use crate::model::config::HybridConfig;

/// `redlite_cuda::ATTENTION_MAX_SPLITS`: flash-decoding splits per head (the cuda crate is
/// an optional dependency, so the number is repeated here and checked by a test under the
/// `cuda` feature).
pub const ATTENTION_MAX_SPLITS: u64 = 64;

/// `redlite_cuda::SMALL_BATCH_MAX_TOKENS`: the tokens the flash-decoding partials hold
/// (repeated for the same reason, checked by the same test).
pub const SMALL_BATCH_MAX_TOKENS: u64 = 4;

/// `redlite_cuda::ONE_TOKEN_KERNELS_MAX_TOKENS`: the rows whose Q8_K codes each workspace
/// buffer keeps (`CudaAct`'s codes, written by the norms) and the scratch keeps of the
/// mixer output (`Scratch::o_q8`, written by the fused DeltaNet step); repeated and checked
/// likewise.
pub const Q8_CODE_ROWS: u64 = 16;

/// Bytes of the Q8_K codes a workspace buffer of `rows` rows of `width` keeps: an int8 code
/// per value and an f32 scale per 256 values, for up to `Q8_CODE_ROWS` rows.
fn q8_code_bytes(rows: u64, width: u64) -> u64 {
    rows.min(Q8_CODE_ROWS) * (width + 4 * width / 256)
}

/// What the activations of a batch of `rows` cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Activations {
    /// Rows of every buffer: the largest batch one forward call holds.
    pub rows: u64,
    /// Bytes per row over the workspace and every scratch buffer.
    pub bytes_per_row: u64,
    /// Buffers whose size does not depend on the rows (attention partials, and the Q8_K
    /// codes of the workspace's and the mixer output's first rows).
    pub fixed: u64,
    /// Rows of logits one call returns, and their bytes.
    pub logit_rows: u64,
    pub logits: u64,
    /// MTP: the block's own workspace (`x`, `h`, `mix`, with their codes) and its input's
    /// buffers (the embeddings, the two normed halves and the `[embedding ; hidden]` input
    /// of `eh_proj`: `backend/cuda/mtp.rs`).
    pub mtp: u64,
}

impl Activations {
    pub fn total(&self) -> u64 {
        self.rows
            .saturating_mul(self.bytes_per_row)
            .saturating_add(self.fixed)
            .saturating_add(self.logits)
            .saturating_add(self.mtp)
    }
}

/// 4-byte values per row of `Scratch::new` (f32, plus the u32/i32 id buffers), in its order.
fn scratch_values_per_row(c: &HybridConfig) -> u64 {
    let channels = c.conv_channels();
    let inner = c.ssm_inner();
    let attn = c.n_head * c.head_dim;
    let kv = c.n_head_kv * c.head_dim;
    let widths = [
        1,                                // token_ids
        (channels + inner).max(2 * attn), // proj
        channels,                         // qkv
        inner,                            // z
        2 * c.ssm_v_heads,                // ba
        c.ssm_v_heads,                    // beta
        c.ssm_v_heads,                    // g
        inner.max(attn),                  // o
        attn,                             // q
        kv,                               // k
        kv,                               // v
        c.n_expert + 1,                   // router (+ the shared gate's logit in decode)
        1,                                // shared_logit
        1,                                // shared_weight
        c.n_expert_used,                  // ids
        c.n_expert_used,                  // weights
        c.n_expert_used * c.expert_ff,    // act
        c.shared_ff,                      // act_shared
        1,                                // zero_ids
        c.n_expert_used,                  // slot_ids
        2 * c.n_expert_used,              // fills
        c.n_expert_used,                  // wave_ids
        c.n_expert_used * c.n_embd,       // pair_out (per-pair down products of a prompt)
        c.n_expert_used,                  // ones
    ];
    widths.iter().map(|&w| w.max(1) as u64).sum()
}

/// Activations of a forward call holding `rows` tokens and returning `logit_rows` rows of
/// logits; `mtp` adds the MTP block's inputs.
pub fn activations(c: &HybridConfig, rows: u64, logit_rows: u64, mtp: bool) -> Activations {
    let e = c.n_embd as u64;
    let workspace = 3 * e;
    let partials =
        SMALL_BATCH_MAX_TOKENS * c.n_head as u64 * ATTENTION_MAX_SPLITS * (c.head_dim as u64 + 2);
    let logit_rows = logit_rows.max(1);
    let codes = 3 * q8_code_bytes(rows, e);
    let mixer_out = (c.ssm_inner().max(c.n_head * c.head_dim)) as u64;
    Activations {
        rows,
        bytes_per_row: 4 * (workspace + scratch_values_per_row(c)),
        fixed: 4 * partials + codes + q8_code_bytes(rows, mixer_out),
        logit_rows,
        logits: logit_rows.saturating_mul(4 * c.n_vocab as u64),
        mtp: if mtp {
            rows.saturating_mul(4 * (3 + 5) * e) + codes
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::Preset;

    #[test]
    fn full_model_row_is_pinned() {
        let c = Preset::Full.config();
        // 3 x 2048 workspace values + 60,619 scratch values (20,480 of them the per-pair
        // down products; the router's 512 + 1 for the shared gate's logit), 4 bytes each.
        assert_eq!(scratch_values_per_row(&c), 60_619);
        let a = activations(&c, 513, 1, false);
        assert_eq!(a.bytes_per_row, 267_052);
        // The partials, 16 rows of codes for each of x, h and mix and for the mixer output.
        let codes = 3 * 16 * (2048 + 32) + 16 * (4096 + 64);
        assert_eq!(a.fixed, 4 * 16 * 64 * 258 * 4 + codes);
        assert_eq!(a.logits, 151_936 * 4);
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn partials_match_the_cuda_crate() {
        let c = Preset::Full.config();
        let a = activations(&c, 1, 1, false);
        let small = redlite_cuda::SMALL_BATCH_MAX_TOKENS;
        assert_eq!(small as u64, SMALL_BATCH_MAX_TOKENS);
        let len = redlite_cuda::attention_partials_len(small, c.n_head, c.head_dim) as u64;
        let code_rows = redlite_cuda::ONE_TOKEN_KERNELS_MAX_TOKENS as u64;
        assert_eq!(code_rows, Q8_CODE_ROWS);
        // One row of codes for each of x, h and mix, and for the mixer output.
        let code_bytes = |width: usize| (width + 4 * width / redlite_cuda::Q8_BLOCK_VALUES) as u64;
        let codes = 3 * code_bytes(c.n_embd) + code_bytes(c.ssm_inner().max(c.n_head * c.head_dim));
        assert_eq!(a.fixed, 4 * len + codes);
    }
}
