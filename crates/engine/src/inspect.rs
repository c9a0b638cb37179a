//! `redlite inspect`: what a GGUF file holds and what the engine will make of it.

use std::collections::BTreeMap;
use std::fmt;

use redlite_gguf::{GgufModel, Value};
use serde::Serialize;

use crate::model::config::{DeltaNetLayout, HybridConfig};
use crate::model::load::config_from_gguf;

#[derive(Debug, Serialize)]
pub struct TensorRow {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: String,
    /// Outermost first.
    pub shape: Vec<u64>,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TypeTotal {
    pub tensors: usize,
    pub elements: u64,
    pub bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct Tokenizer {
    pub model: Option<String>,
    pub pre: Option<String>,
    pub tokens: usize,
    pub merges: usize,
    pub eos_token_id: Option<u64>,
    pub bos_token_id: Option<u64>,
    pub padding_token_id: Option<u64>,
    pub add_bos_token: Option<bool>,
    pub chat_template_bytes: usize,
}

#[derive(Debug, Serialize)]
pub struct ContextMemory {
    pub tokens: u64,
    pub kv_f32_bytes: u64,
    pub kv_f16_bytes: u64,
    /// One sequence's DeltaNet state (f32), whatever the length.
    pub deltanet_state_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct InspectReport {
    pub files: Vec<String>,
    pub file_bytes: u64,
    pub gguf_version: u32,
    pub architecture: Option<String>,
    pub name: Option<String>,
    pub file_type: Option<u64>,
    /// The hyperparameters the engine will use, or why it refuses the file.
    pub config: Option<HybridConfig>,
    pub config_error: Option<String>,
    pub deltanet_layout: Option<DeltaNetLayout>,
    pub mtp_block: bool,
    pub tokenizer: Tokenizer,
    pub tensor_count: usize,
    pub types: BTreeMap<String, TypeTotal>,
    pub expert_bits_per_weight: Option<f64>,
    pub other_bits_per_weight: Option<f64>,
    pub context: Option<ContextMemory>,
    pub tensors: Vec<TensorRow>,
}

fn bpw(bytes: u64, elements: u64) -> Option<f64> {
    (elements > 0).then(|| bytes as f64 * 8.0 / elements as f64)
}

pub fn inspect(model: &GgufModel, context_tokens: u64) -> InspectReport {
    let md = model.metadata();
    let string = |k: &str| md.get(k).and_then(Value::as_str).map(str::to_string);
    let array_len = |k: &str| {
        md.get(k)
            .and_then(Value::as_array)
            .map_or(0, <[Value]>::len)
    };
    let (config, config_error) = match config_from_gguf(model) {
        Ok(c) => (Some(c), None),
        Err(e) => (None, Some(e.to_string())),
    };
    let mut types: BTreeMap<String, TypeTotal> = BTreeMap::new();
    let (mut exp_bytes, mut exp_elems, mut other_bytes, mut other_elems) = (0, 0, 0, 0);
    let mut tensors = Vec::new();
    for t in model.tensors() {
        let total = types.entry(t.ty.name().to_string()).or_insert(TypeTotal {
            tensors: 0,
            elements: 0,
            bytes: 0,
        });
        total.tensors += 1;
        total.elements += t.elements();
        total.bytes += t.bytes;
        if t.name.ends_with("_exps.weight") {
            exp_bytes += t.bytes;
            exp_elems += t.elements();
        } else {
            other_bytes += t.bytes;
            other_elems += t.elements();
        }
        tensors.push(TensorRow {
            name: t.name.clone(),
            ty: t.ty.name().to_string(),
            shape: t.shape.clone(),
            bytes: t.bytes,
        });
    }
    let context = config.as_ref().map(|c| ContextMemory {
        tokens: context_tokens,
        kv_f32_bytes: c.kv_bytes_per_position(4) * context_tokens,
        kv_f16_bytes: c.kv_bytes_per_position(2) * context_tokens,
        deltanet_state_bytes: c.deltanet_state_bytes(),
    });
    InspectReport {
        files: model
            .files()
            .iter()
            .map(|f| f.path().display().to_string())
            .collect(),
        file_bytes: model.file_bytes(),
        gguf_version: model.files()[0].version(),
        architecture: string("general.architecture"),
        name: string("general.name"),
        file_type: md.get("general.file_type").and_then(Value::as_u64),
        deltanet_layout: config.as_ref().map(|c| c.layout),
        mtp_block: config.as_ref().is_some_and(|c| c.n_mtp > 0),
        config,
        config_error,
        tokenizer: Tokenizer {
            model: string("tokenizer.ggml.model"),
            pre: string("tokenizer.ggml.pre"),
            tokens: array_len("tokenizer.ggml.tokens"),
            merges: array_len("tokenizer.ggml.merges"),
            eos_token_id: md
                .get("tokenizer.ggml.eos_token_id")
                .and_then(Value::as_u64),
            bos_token_id: md
                .get("tokenizer.ggml.bos_token_id")
                .and_then(Value::as_u64),
            padding_token_id: md
                .get("tokenizer.ggml.padding_token_id")
                .and_then(Value::as_u64),
            add_bos_token: md
                .get("tokenizer.ggml.add_bos_token")
                .and_then(Value::as_bool),
            chat_template_bytes: string("tokenizer.chat_template").map_or(0, |s| s.len()),
        },
        tensor_count: model.tensor_count(),
        types,
        expert_bits_per_weight: bpw(exp_bytes, exp_elems),
        other_bits_per_weight: bpw(other_bytes, other_elems),
        context,
        tensors,
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

impl fmt::Display for InspectReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for path in &self.files {
            writeln!(f, "file          {path}")?;
        }
        writeln!(
            f,
            "size          {} ({} bytes), GGUF v{}",
            gib(self.file_bytes),
            self.file_bytes,
            self.gguf_version
        )?;
        writeln!(
            f,
            "architecture  {}",
            self.architecture.as_deref().unwrap_or("(none)")
        )?;
        if let Some(name) = &self.name {
            writeln!(f, "name          {name}")?;
        }
        match (&self.config, &self.config_error) {
            (Some(c), _) => {
                let attn = c.attention_layers();
                writeln!(
                    f,
                    "layers        {} ({} DeltaNet, {} attention){}",
                    c.n_layer,
                    c.n_layer - attn,
                    attn,
                    if c.n_mtp > 0 { " + 1 MTP block" } else { "" }
                )?;
                writeln!(
                    f,
                    "hidden        {}   vocab {}   context {}",
                    c.n_embd, c.n_vocab, c.context_length
                )?;
                writeln!(
                    f,
                    "attention     {} q heads, {} kv heads, head dim {}, rope {} dims base {}",
                    c.n_head, c.n_head_kv, c.head_dim, c.rope_dim, c.rope_base
                )?;
                writeln!(
                    f,
                    "deltanet      {} qk heads, {} v heads, head dim {}, conv {}, layout {}",
                    c.ssm_k_heads,
                    c.ssm_v_heads,
                    c.ssm_head_dim,
                    c.conv_kernel,
                    match c.layout {
                        DeltaNetLayout::Split => "attn_qkv + attn_gate",
                        DeltaNetLayout::Legacy => "legacy ssm_in",
                    }
                )?;
                writeln!(
                    f,
                    "moe           {} experts, {} used, width {}, shared expert width {}",
                    c.n_expert, c.n_expert_used, c.expert_ff, c.shared_ff
                )?;
                writeln!(f, "rms eps       {:e}", c.rms_eps)?;
            }
            (None, Some(e)) => writeln!(f, "config        refused: {e}")?,
            (None, None) => {}
        }
        let t = &self.tokenizer;
        writeln!(
            f,
            "tokenizer     {} / {}, {} tokens, {} merges, eos {:?}, bos {:?}, add_bos {:?}, chat template {} bytes",
            t.model.as_deref().unwrap_or("-"),
            t.pre.as_deref().unwrap_or("-"),
            t.tokens,
            t.merges,
            t.eos_token_id,
            t.bos_token_id,
            t.add_bos_token,
            t.chat_template_bytes
        )?;
        if let Some(c) = &self.context {
            writeln!(
                f,
                "context {:>6}  KV f32 {}, KV f16 {}, DeltaNet state {} per sequence",
                c.tokens,
                mib(c.kv_f32_bytes),
                mib(c.kv_f16_bytes),
                mib(c.deltanet_state_bytes)
            )?;
        }
        let fmt_bpw = |b: Option<f64>| b.map_or("-".to_string(), |b| format!("{b:.3}"));
        writeln!(
            f,
            "bits/weight   experts {}, rest {}",
            fmt_bpw(self.expert_bits_per_weight),
            fmt_bpw(self.other_bits_per_weight)
        )?;
        writeln!(f, "\n{} tensors by type:", self.tensor_count)?;
        for (ty, total) in &self.types {
            writeln!(
                f,
                "  {ty:<8} {:>5} tensors {:>16} values {:>12}",
                total.tensors,
                total.elements,
                gib(total.bytes)
            )?;
        }
        writeln!(
            f,
            "\n{:<40} {:<8} {:<22} {:>14}",
            "tensor", "type", "shape", "bytes"
        )?;
        for row in &self.tensors {
            writeln!(
                f,
                "{:<40} {:<8} {:<22} {:>14}",
                row.name,
                row.ty,
                format!("{:?}", row.shape),
                row.bytes
            )?;
        }
        Ok(())
    }
}
