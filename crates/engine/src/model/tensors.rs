//! The tensors a qwen3next file holds, with the shape its config implies (outermost first)
//! and the role each plays. The synthetic writer writes exactly this list; the loader
//! checks a file against it.

use crate::model::config::{DeltaNetLayout, HybridConfig, LayerKind};

/// What a tensor is, independent of its layer (decides its type in a quantization recipe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Role {
    TokenEmbd,
    Output,
    /// Any RMSNorm weight (stored already multiplied form, see the spec §2.5).
    Norm,
    /// DeltaNet gated-norm weight (plain weight, not +1).
    SsmNorm,
    SsmA,
    SsmDtBias,
    SsmConv,
    /// DeltaNet `attn_qkv` (split layout).
    SsmQkv,
    /// DeltaNet `attn_gate` (split layout).
    SsmGate,
    /// DeltaNet `ssm_in` (legacy layout).
    SsmIn,
    SsmBa,
    SsmOut,
    AttnQ,
    AttnK,
    AttnV,
    AttnOutput,
    Router,
    SharedExpertGate,
    ExpertGate,
    ExpertUp,
    ExpertDown,
    SharedGate,
    SharedUp,
    SharedDown,
    /// MTP: projection of `[embedding ; hidden]`.
    MtpEhProj,
}

impl Role {
    /// Roles that are always stored as F32 (vectors and small tables).
    pub fn is_always_f32(self) -> bool {
        matches!(
            self,
            Role::Norm
                | Role::SsmNorm
                | Role::SsmA
                | Role::SsmDtBias
                | Role::SsmConv
                | Role::Router
        )
    }

    /// Routed-expert tensors (97 % of the weights of the 80B model).
    pub fn is_expert(self) -> bool {
        matches!(self, Role::ExpertGate | Role::ExpertUp | Role::ExpertDown)
    }
}

/// One expected tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorPlan {
    pub name: String,
    pub role: Role,
    /// Outermost first: a weight is `[out, in]`, an expert stack `[n_expert, out, in]`.
    pub shape: Vec<u64>,
    /// Layer index (`None` for global tensors); the MTP block has index `n_layer`.
    pub layer: Option<usize>,
}

struct Builder {
    out: Vec<TensorPlan>,
}

impl Builder {
    fn add(&mut self, layer: Option<usize>, suffix: &str, role: Role, shape: &[usize]) {
        let name = match layer {
            Some(i) => format!("blk.{i}.{suffix}"),
            None => suffix.to_string(),
        };
        self.out.push(TensorPlan {
            name,
            role,
            shape: shape.iter().map(|&d| d as u64).collect(),
            layer,
        });
    }
}

/// Every tensor of a file with this config, in writing order.
pub fn expected_tensors(c: &HybridConfig) -> Vec<TensorPlan> {
    let mut b = Builder { out: Vec::new() };
    let e = c.n_embd;
    b.add(None, "token_embd.weight", Role::TokenEmbd, &[c.n_vocab, e]);
    for (i, kind) in c.layers.iter().enumerate() {
        let l = Some(i);
        b.add(l, "attn_norm.weight", Role::Norm, &[e]);
        match kind {
            LayerKind::DeltaNet => add_deltanet(&mut b, c, i),
            LayerKind::Attention => add_attention(&mut b, c, i),
        }
        b.add(l, "post_attention_norm.weight", Role::Norm, &[e]);
        add_moe(&mut b, c, i);
    }
    for i in c.n_layer..c.n_layer + c.n_mtp {
        let l = Some(i);
        b.add(l, "nextn.eh_proj.weight", Role::MtpEhProj, &[e, 2 * e]);
        b.add(l, "nextn.enorm.weight", Role::Norm, &[e]);
        b.add(l, "nextn.hnorm.weight", Role::Norm, &[e]);
        b.add(l, "attn_norm.weight", Role::Norm, &[e]);
        add_attention(&mut b, c, i);
        b.add(l, "post_attention_norm.weight", Role::Norm, &[e]);
        add_moe(&mut b, c, i);
        b.add(l, "nextn.shared_head_norm.weight", Role::Norm, &[e]);
    }
    b.add(None, "output_norm.weight", Role::Norm, &[e]);
    b.add(None, "output.weight", Role::Output, &[c.n_vocab, e]);
    b.out
}

fn add_deltanet(b: &mut Builder, c: &HybridConfig, i: usize) {
    let l = Some(i);
    let e = c.n_embd;
    match c.layout {
        DeltaNetLayout::Split => {
            b.add(l, "attn_qkv.weight", Role::SsmQkv, &[c.conv_channels(), e]);
            b.add(l, "attn_gate.weight", Role::SsmGate, &[c.ssm_inner(), e]);
        }
        DeltaNetLayout::Legacy => {
            b.add(
                l,
                "ssm_in.weight",
                Role::SsmIn,
                &[c.conv_channels() + c.ssm_inner(), e],
            );
        }
    }
    b.add(l, "ssm_ba.weight", Role::SsmBa, &[2 * c.ssm_v_heads, e]);
    b.add(
        l,
        "ssm_conv1d.weight",
        Role::SsmConv,
        &[c.conv_channels(), c.conv_kernel],
    );
    b.add(l, "ssm_dt.bias", Role::SsmDtBias, &[c.ssm_v_heads]);
    b.add(l, "ssm_a", Role::SsmA, &[c.ssm_v_heads]);
    b.add(l, "ssm_norm.weight", Role::SsmNorm, &[c.ssm_head_dim]);
    b.add(l, "ssm_out.weight", Role::SsmOut, &[e, c.ssm_inner()]);
}

fn add_attention(b: &mut Builder, c: &HybridConfig, i: usize) {
    let l = Some(i);
    let e = c.n_embd;
    b.add(
        l,
        "attn_q.weight",
        Role::AttnQ,
        &[2 * c.n_head * c.head_dim, e],
    );
    b.add(
        l,
        "attn_k.weight",
        Role::AttnK,
        &[c.n_head_kv * c.head_dim, e],
    );
    b.add(
        l,
        "attn_v.weight",
        Role::AttnV,
        &[c.n_head_kv * c.head_dim, e],
    );
    b.add(
        l,
        "attn_output.weight",
        Role::AttnOutput,
        &[e, c.n_head * c.head_dim],
    );
    b.add(l, "attn_q_norm.weight", Role::Norm, &[c.head_dim]);
    b.add(l, "attn_k_norm.weight", Role::Norm, &[c.head_dim]);
}

fn add_moe(b: &mut Builder, c: &HybridConfig, i: usize) {
    let l = Some(i);
    let e = c.n_embd;
    b.add(l, "ffn_gate_inp.weight", Role::Router, &[c.n_expert, e]);
    b.add(
        l,
        "ffn_gate_exps.weight",
        Role::ExpertGate,
        &[c.n_expert, c.expert_ff, e],
    );
    b.add(
        l,
        "ffn_up_exps.weight",
        Role::ExpertUp,
        &[c.n_expert, c.expert_ff, e],
    );
    b.add(
        l,
        "ffn_down_exps.weight",
        Role::ExpertDown,
        &[c.n_expert, e, c.expert_ff],
    );
    b.add(l, "ffn_gate_inp_shexp.weight", Role::SharedExpertGate, &[e]);
    b.add(
        l,
        "ffn_gate_shexp.weight",
        Role::SharedGate,
        &[c.shared_ff, e],
    );
    b.add(l, "ffn_up_shexp.weight", Role::SharedUp, &[c.shared_ff, e]);
    b.add(
        l,
        "ffn_down_shexp.weight",
        Role::SharedDown,
        &[e, c.shared_ff],
    );
}
