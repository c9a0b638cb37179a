//! The CPU engine against the reference goldens (tests/golden, written by
//! scripts/reference/make_goldens.sh from transformers and llama.cpp on tiny synth files):
//!
//! * exact precision (f32 math on dequantized weights) against transformers: logits and the
//!   residual stream after every layer, so a failure names the first layer that diverges;
//! * ggml precision (activations quantized as llama.cpp does) against llama.cpp: top-1, the
//!   reference's near-ties excepted.

mod golden_support;

use std::sync::Arc;

use golden_support::{golden_dir, read_golden, regenerate, rel_l2, Entry};
use redlite_engine::backend::cpu::linear::Precision;
use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_gguf::GgufModel;

const PROMPTS: [&str; 4] = ["t1", "t7", "t64", "t200"];

struct Model {
    name: String,
    gguf: Arc<GgufModel>,
    golden: std::collections::HashMap<String, Entry>,
}

fn models(dir: &std::path::Path) -> Vec<Model> {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_dir().join("manifest.json")).unwrap())
            .unwrap();
    manifest["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let name = m["name"].as_str().unwrap().to_string();
            let args: Vec<String> = m["synth_args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap().to_string())
                .collect();
            let path = regenerate(dir, &name, &args, m["gguf_sha256"].as_str().unwrap());
            Model {
                golden: read_golden(&golden_dir().join(m["golden"].as_str().unwrap())),
                gguf: Arc::new(GgufModel::open(&path).unwrap()),
                name,
            }
        })
        .collect()
}

fn run(
    model: &Model,
    precision: Precision,
    tokens: &[u32],
    hidden: bool,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    let config = config_from_gguf(&model.gguf).unwrap();
    let backend = CpuBackend::with_precision(model.gguf.clone(), config, precision).unwrap();
    let mut session = Session::new(backend, tokens.len(), KvType::F32, 512).unwrap();
    let out = session.feed(tokens, true, hidden).unwrap();
    (out.logits, out.hidden)
}

fn tokens(model: &Model, prompt: &str) -> Vec<u32> {
    model.golden[&format!("{prompt}/tokens")]
        .i32()
        .iter()
        .map(|&t| t as u32)
        .collect()
}

/// Our logits at the reference's top-k ids against its top-k values, per position.
fn topk_rel(ours: &[f32], vocab: usize, ids: &Entry, vals: &Entry) -> Vec<f64> {
    let k = ids.shape[1];
    (0..ids.shape[0])
        .map(|p| {
            let mine: Vec<f32> = ids.i32()[p * k..(p + 1) * k]
                .iter()
                .map(|&i| ours[p * vocab + i as usize])
                .collect();
            rel_l2(&mine, &vals.f32()[p * k..(p + 1) * k])
        })
        .collect()
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        )
        .0
}

#[test]
fn exact_precision_matches_transformers_layer_by_layer() {
    let dir = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    for model in models(dir.path()) {
        let mut worst_logits = 0f64;
        let mut worst_hidden = 0f64;
        for prompt in PROMPTS {
            let toks = tokens(&model, prompt);
            let has_hidden = model.golden.contains_key(&format!("{prompt}/hf/hidden"));
            let (logits, hidden) = run(&model, Precision::Exact, &toks, has_hidden);
            let vocab = logits.len() / toks.len();
            if has_hidden {
                let reference = &model.golden[&format!("{prompt}/hf/hidden")];
                let per_layer = reference.shape[1] * reference.shape[2];
                for (layer, ours) in hidden.iter().enumerate() {
                    let theirs = &reference.f32()[layer * per_layer..(layer + 1) * per_layer];
                    let rel = rel_l2(ours, theirs);
                    worst_hidden = worst_hidden.max(rel);
                    let what = if layer == 0 {
                        "the embedding".to_string()
                    } else {
                        format!("layer {}", layer - 1)
                    };
                    assert!(
                        rel <= 1e-4,
                        "{} {prompt}: {what} diverges from transformers (relative L2 {rel:.2e})",
                        model.name
                    );
                }
            }
            if let Some(full) = model.golden.get(&format!("{prompt}/hf/logits")) {
                for (p, (a, b)) in logits
                    .chunks(vocab)
                    .zip(full.f32().chunks(vocab))
                    .enumerate()
                {
                    let rel = rel_l2(a, b);
                    worst_logits = worst_logits.max(rel);
                    assert!(
                        rel <= 1e-4,
                        "{} {prompt} position {p}: logits differ by {rel:.2e}",
                        model.name
                    );
                }
            }
            let rels = topk_rel(
                &logits,
                vocab,
                &model.golden[&format!("{prompt}/hf/topk_ids")],
                &model.golden[&format!("{prompt}/hf/topk_vals")],
            );
            for (p, rel) in rels.iter().enumerate() {
                worst_logits = worst_logits.max(*rel);
                assert!(
                    *rel <= 1e-3,
                    "{} {prompt} position {p}: top-k logits differ by {rel:.2e}",
                    model.name
                );
            }
        }
        table.push(format!(
            "| {} | {worst_logits:.1e} | {worst_hidden:.1e} |",
            model.name
        ));
    }
    println!("| model | exact vs transformers: max rel L2 (logits) | per-layer hidden |\n|---|---|---|\n{}", table.join("\n"));
}

#[test]
fn ggml_precision_matches_llamacpp_top1() {
    // Relative gap under which two of the reference's logits count as tied: the logits of
    // these quantized models differ from llama.cpp's by ~1e-2 relative (the table's last
    // column), so a smaller gap is not a reliable order.
    const TIE: f32 = 1e-2;
    let dir = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    for model in models(dir.path()) {
        let (mut agree, mut total, mut worst) = (0usize, 0usize, 0f64);
        for prompt in PROMPTS {
            let toks = tokens(&model, prompt);
            let (logits, _) = run(&model, Precision::Ggml, &toks, false);
            let vocab = logits.len() / toks.len();
            let ids = &model.golden[&format!("{prompt}/llamacpp/topk_ids")];
            let vals = model.golden[&format!("{prompt}/llamacpp/topk_vals")].f32();
            let k = ids.shape[1];
            for p in 0..toks.len() {
                total += 1;
                let (ids, vals) = (&ids.i32()[p * k..(p + 1) * k], &vals[p * k..(p + 1) * k]);
                let ours = argmax(&logits[p * vocab..(p + 1) * vocab]);
                // A near-tie in the reference (its top two within TIE of each other) may
                // go either way under another summation order: ours is then its runner-up.
                let tie = ids
                    .iter()
                    .zip(vals)
                    .any(|(&id, &v)| id as usize == ours && vals[0] - v <= TIE * vals[0].abs());
                agree += usize::from(ours == ids[0] as usize || tie);
            }
            let rels = topk_rel(
                &logits,
                vocab,
                ids,
                &model.golden[&format!("{prompt}/llamacpp/topk_vals")],
            );
            worst = rels.iter().copied().fold(worst, f64::max);
        }
        let rate = agree as f64 / total as f64;
        table.push(format!(
            "| {} | {agree}/{total} | {worst:.1e} |",
            model.name
        ));
        assert!(
            rate >= 0.99,
            "{}: top-1 agreement with llama.cpp {agree}/{total}",
            model.name
        );
    }
    println!("| model | ggml precision vs llama.cpp: top-1 | max rel L2 (top-32 logits) |\n|---|---|---|\n{}", table.join("\n"));
}
