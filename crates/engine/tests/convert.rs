//! `convert` against files it did not write: a tiny synthetic model in the *legacy* layout
//! (its `ssm_in` is, per the spec, Hugging Face's `in_proj_qkvz` row for row) and with the
//! MTP block is turned into a Hugging Face checkpoint by the inverse of the converter's
//! documented transforms (norms stored as `w - 1`, `A_log = ln(-ssm_a)`, conv taps
//! `[C, 1, K]`, experts one tensor each or packed as transformers saves them, a tokenizer.json
//! from its vocabulary), converted
//! back in the *split* layout, and checked: every tensor equal (the de-interleaved
//! `attn_qkv`/`attn_gate` against the legacy `ssm_in` rows the spec names), the metadata
//! and vocabulary equal (the MTP block counted from its tensors, as Qwen3-Next's config.json
//! does not name it), and the CPU engine's logits on both files equal.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::convert::{convert, ConvertOptions};
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::model::tensors::expected_tensors;
use redlite_engine::model::{DeltaNetLayout, HybridConfig};
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::{GgmlType, GgufModel, Value};
use safetensors::{Dtype, View};
use serde_json::json;

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

struct Tensor {
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl View for &Tensor {
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(&self.data)
    }
    fn data_len(&self) -> usize {
        self.data.len()
    }
}

fn tensor(shape: &[usize], values: &[f32]) -> Tensor {
    Tensor {
        shape: shape.to_vec(),
        data: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// The Hugging Face name and the inverse transform of a GGUF tensor (spec §2).
fn hf_name(c: &HybridConfig, name: &str) -> (String, &'static str) {
    let fixed = [
        ("token_embd.weight", "model.embed_tokens.weight", ""),
        ("output_norm.weight", "model.norm.weight", "minus1"),
        ("output.weight", "lm_head.weight", ""),
    ];
    if let Some((_, hf, t)) = fixed.iter().find(|(g, _, _)| *g == name) {
        return (hf.to_string(), t);
    }
    let rest = name.strip_prefix("blk.").unwrap();
    let (layer, suffix) = rest.split_once('.').unwrap();
    let layer: usize = layer.parse().unwrap();
    let mtp = layer >= c.n_layer;
    let nextn = [
        ("nextn.eh_proj.weight", "mtp.fc.weight", ""),
        (
            "nextn.enorm.weight",
            "mtp.pre_fc_norm_embedding.weight",
            "minus1",
        ),
        (
            "nextn.hnorm.weight",
            "mtp.pre_fc_norm_hidden.weight",
            "minus1",
        ),
        ("nextn.shared_head_norm.weight", "mtp.norm.weight", "minus1"),
    ];
    if let Some((_, hf, t)) = nextn.iter().find(|(g, _, _)| *g == suffix) {
        return (hf.to_string(), t);
    }
    let prefix = if mtp {
        format!("mtp.layers.{}.", layer - c.n_layer)
    } else {
        format!("model.layers.{layer}.")
    };
    let table = [
        ("attn_norm.weight", "input_layernorm.weight", "minus1"),
        (
            "post_attention_norm.weight",
            "post_attention_layernorm.weight",
            "minus1",
        ),
        ("ffn_gate_inp.weight", "mlp.gate.weight", ""),
        ("ffn_gate_exps.weight", "mlp.experts.gate_proj", "experts"),
        ("ffn_up_exps.weight", "mlp.experts.up_proj", "experts"),
        ("ffn_down_exps.weight", "mlp.experts.down_proj", "experts"),
        (
            "ffn_gate_inp_shexp.weight",
            "mlp.shared_expert_gate.weight",
            "row",
        ),
        (
            "ffn_gate_shexp.weight",
            "mlp.shared_expert.gate_proj.weight",
            "",
        ),
        (
            "ffn_up_shexp.weight",
            "mlp.shared_expert.up_proj.weight",
            "",
        ),
        (
            "ffn_down_shexp.weight",
            "mlp.shared_expert.down_proj.weight",
            "",
        ),
        ("attn_q.weight", "self_attn.q_proj.weight", ""),
        ("attn_k.weight", "self_attn.k_proj.weight", ""),
        ("attn_v.weight", "self_attn.v_proj.weight", ""),
        ("attn_output.weight", "self_attn.o_proj.weight", ""),
        ("attn_q_norm.weight", "self_attn.q_norm.weight", "minus1"),
        ("attn_k_norm.weight", "self_attn.k_norm.weight", "minus1"),
        ("ssm_conv1d.weight", "linear_attn.conv1d.weight", "conv"),
        ("ssm_dt.bias", "linear_attn.dt_bias", ""),
        ("ssm_a", "linear_attn.A_log", "log_neg"),
        ("ssm_ba.weight", "linear_attn.in_proj_ba.weight", ""),
        ("ssm_norm.weight", "linear_attn.norm.weight", ""),
        ("ssm_out.weight", "linear_attn.out_proj.weight", ""),
        ("ssm_in.weight", "linear_attn.in_proj_qkvz.weight", ""),
    ];
    let (_, hf, t) = table.iter().find(|(g, _, _)| *g == suffix).unwrap();
    (format!("{prefix}{hf}"), t)
}

/// Writes the Hugging Face folder of `gguf` (legacy layout, F32 tensors).
fn write_checkpoint(gguf: &GgufModel, c: &HybridConfig, dir: &Path) {
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for plan in expected_tensors(c) {
        let values = f32s(gguf.tensor_data(&plan.name).unwrap());
        let shape: Vec<usize> = plan.shape.iter().map(|&d| d as usize).collect();
        let (name, transform) = hf_name(c, &plan.name);
        match transform {
            // Layer 0 in transformers' packed form, the others one tensor per expert.
            "experts" if plan.layer == Some(0) => {
                let (stem, proj) = name.rsplit_once('.').unwrap();
                if proj == "down_proj" {
                    tensors.insert(format!("{stem}.down_proj"), tensor(&shape, &values));
                } else if proj == "gate_proj" {
                    let up = f32s(gguf.tensor_data("blk.0.ffn_up_exps.weight").unwrap());
                    let per = shape[1] * shape[2];
                    let packed: Vec<f32> = (0..shape[0])
                        .flat_map(|e| {
                            let (g, u) =
                                (&values[e * per..(e + 1) * per], &up[e * per..(e + 1) * per]);
                            g.iter().chain(u).copied().collect::<Vec<f32>>()
                        })
                        .collect();
                    let packed_shape = [shape[0], 2 * shape[1], shape[2]];
                    tensors.insert(
                        format!("{stem}.gate_up_proj"),
                        tensor(&packed_shape, &packed),
                    );
                }
                continue;
            }
            "experts" => {
                let per = shape[1] * shape[2];
                let (stem, proj) = name.rsplit_once('.').unwrap();
                for e in 0..shape[0] {
                    let slab = &values[e * per..(e + 1) * per];
                    let t = tensor(&shape[1..], slab);
                    tensors.insert(format!("{stem}.{e}.{proj}.weight"), t);
                }
                continue;
            }
            "minus1" => {
                let v: Vec<f32> = values.iter().map(|w| w - 1.0).collect();
                tensors.insert(name, tensor(&shape, &v));
            }
            "log_neg" => {
                let v: Vec<f32> = values.iter().map(|a| (-a).ln()).collect();
                tensors.insert(name, tensor(&shape, &v));
            }
            "conv" => {
                tensors.insert(name, tensor(&[shape[0], 1, shape[1]], &values));
            }
            "row" => {
                tensors.insert(name, tensor(&[1, shape[0]], &values));
            }
            _ => {
                tensors.insert(name, tensor(&shape, &values));
            }
        }
    }
    let views: Vec<(String, &Tensor)> = tensors.iter().map(|(k, v)| (k.clone(), v)).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();

    let md = gguf.metadata();
    let config = json!({
        "architectures": ["Qwen3NextForCausalLM"],
        "bos_token_id": md.u64("tokenizer.ggml.bos_token_id").unwrap(),
        "eos_token_id": md.u64("tokenizer.ggml.eos_token_id").unwrap(),
        "model_type": "qwen3_next",
        "num_hidden_layers": c.n_layer,
        "hidden_size": c.n_embd,
        "vocab_size": c.n_vocab,
        "max_position_embeddings": c.context_length,
        "intermediate_size": c.feed_forward_length,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_head_kv,
        "head_dim": c.head_dim,
        "partial_rotary_factor": c.rope_dim as f64 / c.head_dim as f64,
        "rope_theta": c.rope_base,
        "rms_norm_eps": c.rms_eps,
        "num_experts": c.n_expert,
        "num_experts_per_tok": c.n_expert_used,
        "moe_intermediate_size": c.expert_ff,
        "shared_expert_intermediate_size": c.shared_ff,
        "linear_conv_kernel_dim": c.conv_kernel,
        "linear_key_head_dim": c.ssm_head_dim,
        "linear_value_head_dim": c.ssm_head_dim,
        "linear_num_key_heads": c.ssm_k_heads,
        "linear_num_value_heads": c.ssm_v_heads,
        "full_attention_interval": c.full_attention_interval,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();

    // tokenizer.json from the file's vocabulary: BPE tokens in model.vocab, the others added.
    let strings = |key: &str| -> Vec<String> {
        md.array(key)
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let tokens = strings("tokenizer.ggml.tokens");
    let types: Vec<i64> = md
        .array("tokenizer.ggml.token_type")
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (text, ty)) in tokens.iter().zip(&types).enumerate() {
        match ty {
            1 => {
                vocab.insert(text.clone(), json!(id));
            }
            3 | 4 => added.push(json!({"id": id, "content": text, "special": *ty == 3})),
            _ => {}
        }
    }
    let tokenizer = json!({
        "model": {"type": "BPE", "vocab": vocab, "merges": strings("tokenizer.ggml.merges")},
        "added_tokens": added,
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    let name_of = |key: &str| tokens[md.u64(key).unwrap() as usize].clone();
    let tok_config = json!({
        "eos_token": name_of("tokenizer.ggml.eos_token_id"),
        "pad_token": name_of("tokenizer.ggml.padding_token_id"),
        "add_bos_token": false,
        "chat_template": md.str("tokenizer.chat_template").unwrap(),
    });
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
}

fn logits(gguf: &Arc<GgufModel>, tokens: &[u32]) -> Vec<f32> {
    let config = config_from_gguf(gguf).unwrap();
    let backend = CpuBackend::new(gguf.clone(), config).unwrap();
    let mut session = Session::new(backend, 256, KvType::F32, 64).unwrap();
    session.feed(tokens, true, false).unwrap().logits
}

#[test]
fn a_checkpoint_converts_back_to_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Preset::Tiny.config();
    config.layout = DeltaNetLayout::Legacy;
    config.n_mtp = 1;
    let original_path = dir.path().join("legacy.gguf");
    let opts = SynthOptions {
        config: config.clone(),
        recipe: Recipe::F32,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    write_synth(&original_path, &opts, &mut |_, _| {}).unwrap();
    let original = Arc::new(GgufModel::open(&original_path).unwrap());
    let hf = dir.path().join("hf");
    std::fs::create_dir(&hf).unwrap();
    write_checkpoint(&original, &config, &hf);

    let out = dir.path().join("converted.gguf");
    let options = ConvertOptions {
        ty: GgmlType::F32,
        layout: DeltaNetLayout::Split,
    };
    convert(&hf, &out, &options, &mut |_, _| {}).unwrap();
    let converted = Arc::new(GgufModel::open(&out).unwrap());

    // Every tensor: the split DeltaNet projections are the legacy ssm_in rows de-interleaved
    // per key-head group ([q | k | v v | z z] per group, spec §2.4).
    let mut split = config.clone();
    split.layout = DeltaNetLayout::Split;
    let (g, d, e) = (config.ssm_k_heads, config.ssm_head_dim, config.n_embd);
    let r = config.ssm_v_heads / g;
    let group = 2 * d + 2 * r * d;
    for plan in expected_tensors(&split) {
        let found = f32s(converted.tensor_data(&plan.name).unwrap());
        let layer = plan.layer.unwrap_or(0);
        let want: Vec<f32> =
            if plan.name.ends_with("attn_qkv.weight") || plan.name.ends_with("attn_gate.weight") {
                let ssm_in = f32s(
                    original
                        .tensor_data(&format!("blk.{layer}.ssm_in.weight"))
                        .unwrap(),
                );
                let parts: Vec<(usize, usize)> = if plan.name.ends_with("attn_qkv.weight") {
                    vec![(0, d), (d, d), (2 * d, r * d)]
                } else {
                    vec![(2 * d + r * d, r * d)]
                };
                let mut rows = Vec::new();
                for (start, n) in parts {
                    for k in 0..g {
                        let first = (k * group + start) * e;
                        rows.extend_from_slice(&ssm_in[first..first + n * e]);
                    }
                }
                rows
            } else {
                f32s(original.tensor_data(&plan.name).unwrap())
            };
        assert_eq!(found.len(), want.len(), "{}", plan.name);
        for (i, (a, b)) in found.iter().zip(&want).enumerate() {
            // ssm_a went through ln and exp; everything else is exact.
            let ok = if plan.name.ends_with("ssm_a") {
                (a - b).abs() <= 1e-6 * b.abs()
            } else {
                a.to_bits() == b.to_bits()
            };
            assert!(ok, "{} value {i}: converted {a}, original {b}", plan.name);
        }
    }

    // Metadata: the architecture keys and the vocabulary.
    for (key, value) in original.metadata().iter() {
        let compare = key.starts_with("qwen3next.") || key.starts_with("tokenizer.");
        if !compare
            || key == "qwen3next.attention.recurrent_layers"
            || key == "tokenizer.ggml.token_type"
        {
            continue;
        }
        let found = converted.metadata().get(key);
        assert_eq!(found, Some(value), "metadata {key}");
    }
    // Token types: as the synthetic file's, except that llama.cpp's converter (and ours)
    // makes CONTROL the added tokens shaped `<|...|>` that the tokenizer does not mark
    // special (`<|fim_prefix|>` ...); the synthetic vocabulary keeps them USER_DEFINED.
    let md = original.metadata();
    let tokens = md.array("tokenizer.ggml.tokens").unwrap();
    let types = |m: &GgufModel| -> Vec<i64> {
        m.metadata()
            .array("tokenizer.ggml.token_type")
            .unwrap()
            .iter()
            .map(|v| v.as_i64().unwrap())
            .collect()
    };
    let (want, found) = (types(&original), types(&converted));
    assert_eq!(want.len(), found.len());
    for (i, (w, f)) in want.iter().zip(&found).enumerate() {
        let text = tokens[i].as_str().unwrap();
        let looks_control = text.starts_with("<|") && text.ends_with("|>");
        let expected = if *w == 4 && looks_control { 3 } else { *w };
        assert_eq!(
            *f, expected,
            "token {i} {text:?}: type {f}, expected {expected}"
        );
    }
    assert_eq!(
        converted.metadata().get("general.architecture"),
        Some(&Value::String("qwen3next".into()))
    );

    // The engine computes the same logits from both files.
    let tokens: Vec<u32> = (0..24u32).map(|i| (i * 37 + 11) % 500).collect();
    let (a, b) = (logits(&original, &tokens), logits(&converted, &tokens));
    let vocab = config.n_vocab;
    let worst = a
        .chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            let num: f64 = x.iter().zip(y).map(|(p, q)| f64::from(p - q).powi(2)).sum();
            let den: f64 = x.iter().map(|p| f64::from(*p).powi(2)).sum();
            (num / den).sqrt()
        })
        .fold(0.0f64, f64::max);
    eprintln!("worst relative L2 over positions: {worst:.2e}");
    assert!(worst <= 1e-5, "logits differ by {worst:.2e} (relative L2)");
}

#[test]
fn a_folder_without_a_checkpoint_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let options = ConvertOptions {
        ty: GgmlType::F16,
        layout: DeltaNetLayout::Split,
    };
    let out = dir.path().join("x.gguf");
    let err = convert(dir.path(), &out, &options, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("config.json"), "{err}");
    assert!(!out.exists());
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"architectures": ["LlamaForCausalLM"]}"#,
    )
    .unwrap();
    let err = convert(dir.path(), &out, &options, &mut |_, _| {})
        .unwrap_err()
        .to_string();
    assert!(err.contains("Qwen3NextForCausalLM"), "{err}");
}
