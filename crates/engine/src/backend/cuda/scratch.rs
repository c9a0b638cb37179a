//! Intermediate buffers of the mixers and the MoE, allocated once for the largest batch the
//! workspaces asked for (`Backend::new_act`) and reused: decode allocates nothing. A larger
//! batch than planned grows them once.

use redlite_cuda::{attention_partials_len, CudaSlice, Device, SMALL_BATCH_MAX_TOKENS};

use crate::backend::cuda::q8_buffers::Q8Buffers;

use crate::error::Result;
use crate::model::config::HybridConfig;

pub struct Scratch {
    /// Tokens every buffer below holds.
    pub tokens: usize,
    /// Bumped whenever the buffers are reallocated: a decode step recorded with older
    /// buffers is not replayed.
    pub generation: u64,
    /// Token ids of the batch `[T]`.
    pub token_ids: CudaSlice<u32>,
    /// Legacy `ssm_in` output `[T][channels + inner]`, or attention `qg` `[T][heads][2][hd]`.
    pub proj: CudaSlice<f32>,
    /// DeltaNet conv input/output `[T][channels]`.
    pub qkv: CudaSlice<f32>,
    /// DeltaNet output gate `[T][inner]`.
    pub z: CudaSlice<f32>,
    /// `[T][2 v_heads]`.
    pub ba: CudaSlice<f32>,
    /// `[T][v_heads]` each.
    pub beta: CudaSlice<f32>,
    pub g: CudaSlice<f32>,
    /// Mixer output before its projection: `[T][max(inner, heads x hd)]`.
    pub o: CudaSlice<f32>,
    /// `o` in Q8_K for a batch of decode size, written by the fused DeltaNet step for the
    /// output projection to read.
    pub o_q8: Q8Buffers,
    /// Attention: normed, rotated queries `[T][heads][hd]`; new keys and values
    /// `[T][kv_heads][hd]`.
    pub q: CudaSlice<f32>,
    pub k: CudaSlice<f32>,
    pub v: CudaSlice<f32>,
    /// Flash-decoding partial sums, sized for a small batch (the most tokens that launch the
    /// one-token kernels): `[SMALL_BATCH_MAX_TOKENS][heads][ATTENTION_MAX_SPLITS][hd + 2]`
    /// (larger batches use fewer splits or none).
    pub attn_partials: CudaSlice<f32>,
    /// MoE: router logits `[T][n_expert + 1]` (one token: the shared-expert gate's logit
    /// after the router's), shared-expert gate logit and weight `[T]`,
    /// selected experts and their weights `[T][used]`, SwiGLU activations `[T][used][ff]`
    /// and `[T][shared_ff]`.
    pub router: CudaSlice<f32>,
    pub shared_logit: CudaSlice<f32>,
    pub shared_weight: CudaSlice<f32>,
    pub ids: CudaSlice<i32>,
    pub weights: CudaSlice<f32>,
    pub act: CudaSlice<f32>,
    pub act_shared: CudaSlice<f32>,
    /// `[T]` zeros: the shared expert is expert 0 of a stack of one.
    pub zero_ids: CudaSlice<i32>,
    /// With an expert cache: each pair's slot `[T][used]`, the experts to copy in
    /// (expert, slot) `[T x used][2]` and their count.
    pub slot_ids: CudaSlice<i32>,
    pub fills: CudaSlice<i32>,
    pub fill_count: CudaSlice<i32>,
    /// The fused decode router's ticket counter (one i32, zero between launches).
    pub route_ticket: CudaSlice<i32>,
    /// Prompts: one wave's ids `[T][used]`, each pair's down product `[T][used][n_embd]`, and
    /// `[T][used]` ones (the weight of a per-pair down launch).
    pub wave_ids: CudaSlice<i32>,
    pub pair_out: CudaSlice<f32>,
    pub ones: CudaSlice<f32>,
    /// LM-head output `[logit_rows][vocab]`, grown on demand (decode needs one row).
    pub logits: CudaSlice<f32>,
    pub logit_rows: usize,
    /// Whether the Q8_K buffers are kept (the backend's q8 products), for `reserve`.
    quantized: bool,
}

impl Scratch {
    /// `quantized`: keep the Q8_K buffers of a batch of decode size (the backend's q8
    /// products).
    pub fn new(
        device: &Device,
        c: &HybridConfig,
        tokens: usize,
        quantized: bool,
    ) -> Result<Scratch> {
        let t = tokens.max(1);
        let channels = c.conv_channels();
        let inner = c.ssm_inner();
        let attn = c.n_head * c.head_dim;
        let kv = c.n_head_kv * c.head_dim;
        let f = |n: usize| device.alloc_zeros::<f32>(t * n.max(1));
        Ok(Scratch {
            tokens: t,
            generation: 0,
            token_ids: device.alloc_zeros(t)?,
            proj: f((channels + inner).max(2 * attn))?,
            qkv: f(channels)?,
            z: f(inner)?,
            ba: f(2 * c.ssm_v_heads)?,
            beta: f(c.ssm_v_heads)?,
            g: f(c.ssm_v_heads)?,
            o: f(inner.max(attn))?,
            o_q8: Q8Buffers::new(device, t, inner.max(attn), quantized)?,
            q: f(attn)?,
            k: f(kv)?,
            v: f(kv)?,
            attn_partials: device.alloc_zeros(attention_partials_len(
                SMALL_BATCH_MAX_TOKENS,
                c.n_head,
                c.head_dim,
            ))?,
            router: f(c.n_expert + 1)?,
            shared_logit: f(1)?,
            shared_weight: f(1)?,
            ids: device.alloc_zeros(t * c.n_expert_used.max(1))?,
            weights: f(c.n_expert_used)?,
            act: f(c.n_expert_used * c.expert_ff)?,
            act_shared: f(c.shared_ff)?,
            zero_ids: device.alloc_zeros(t)?,
            slot_ids: device.alloc_zeros(t * c.n_expert_used.max(1))?,
            fills: device.alloc_zeros(2 * t * c.n_expert_used.max(1))?,
            fill_count: device.alloc_zeros(1)?,
            route_ticket: device.alloc_zeros(1)?,
            wave_ids: device.alloc_zeros(t * c.n_expert_used.max(1))?,
            // A one-token batch decodes with the fused down: no per-pair products.
            pair_out: f(if tokens > 1 {
                c.n_expert_used * c.n_embd
            } else {
                1
            })?,
            ones: device.upload(&vec![1.0f32; t * c.n_expert_used.max(1)])?,
            logits: device.alloc_zeros(c.n_vocab.max(1))?,
            logit_rows: 1,
            quantized,
        })
    }

    /// Makes room for `tokens` (reallocating everything when the batch is larger).
    pub fn reserve(&mut self, device: &Device, c: &HybridConfig, tokens: usize) -> Result<()> {
        if tokens > self.tokens {
            let logits = std::mem::replace(&mut self.logits, device.alloc_zeros(1)?);
            let rows = self.logit_rows;
            let generation = self.generation + 1;
            *self = Scratch::new(device, c, tokens, self.quantized)?;
            self.generation = generation;
            self.logits = logits;
            self.logit_rows = rows;
        }
        Ok(())
    }

    /// Makes room for `rows` rows of logits.
    pub fn reserve_logits(&mut self, device: &Device, c: &HybridConfig, rows: usize) -> Result<()> {
        if rows > self.logit_rows {
            self.logits = device.alloc_zeros(rows * c.n_vocab)?;
            self.logit_rows = rows;
        }
        Ok(())
    }
}
