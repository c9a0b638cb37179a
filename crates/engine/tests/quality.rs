//! Perplexity and KL divergence on a tiny model: llama-perplexity's chunking and scoring
//! (checked against NLLs computed here from the logits), KLD of a model with itself is 0,
//! and another model (synthetic files of other recipes hold other random weights) is
//! measurably away.

use std::sync::Arc;

use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::quality::{kl_divergence, perplexity};
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::GgufModel;

fn session(dir: &std::path::Path, recipe: Recipe) -> Session<CpuBackend> {
    let path = dir.join(format!("{}.gguf", recipe.name()));
    let opts = SynthOptions {
        config: Preset::Tiny.config(),
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 3,
    };
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    let gguf = Arc::new(GgufModel::open(&path).unwrap());
    let config = config_from_gguf(&gguf).unwrap();
    Session::new(CpuBackend::new(gguf, config).unwrap(), 64, KvType::F32, 16).unwrap()
}

fn text(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 53 + 7) % 400).collect()
}

#[test]
fn perplexity_scores_the_second_half_of_each_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = session(dir.path(), Recipe::F32);
    let tokens = text(70);
    let report = perplexity(&mut s, &tokens, 32, &mut |_, _| {}).unwrap();
    // 70 tokens hold 2 chunks of 32; each scores positions 16..31.
    assert_eq!(report.per_chunk.len(), 2);
    assert_eq!(report.scored_tokens, 2 * 15);
    let vocab = s.n_vocab();
    let mut sum = 0f64;
    for c in 0..2 {
        s.reset();
        let logits = s
            .feed(&tokens[c * 32..(c + 1) * 32], true, false)
            .unwrap()
            .logits;
        for j in 16..31 {
            let row: Vec<f64> = logits[j * vocab..(j + 1) * vocab]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = row.iter().map(|v| (v - max).exp()).sum::<f64>().ln() + max;
            sum += lse - row[tokens[c * 32 + j + 1] as usize];
        }
    }
    let want = (sum / 30.0).exp();
    assert!(
        (report.ppl / want - 1.0).abs() < 1e-5,
        "{} vs {want}",
        report.ppl
    );
    assert!(report.ppl_error > 0.0);
    assert!(perplexity(&mut s, &tokens[..63], 32, &mut |_, _| {}).is_err());
}

#[test]
fn kld_is_zero_against_itself_and_positive_against_another_model() {
    let dir = tempfile::tempdir().unwrap();
    let mut base = session(dir.path(), Recipe::F32);
    let mut same = session(dir.path(), Recipe::F32);
    let tokens = text(64);
    let r = kl_divergence(&mut base, &mut same, &tokens, 32, &mut |_, _| {}).unwrap();
    assert!(r.mean_kld.abs() < 1e-9, "{}", r.mean_kld);
    assert_eq!(r.same_top1, 1.0);
    assert!((r.ppl - r.base_ppl).abs() < 1e-9);
    let mut other = session(dir.path(), Recipe::IQ2XXS);
    let r = kl_divergence(&mut base, &mut other, &tokens, 32, &mut |_, _| {}).unwrap();
    assert!(
        r.mean_kld > 1e-6 && r.mean_kld.is_finite(),
        "{}",
        r.mean_kld
    );
    assert!(r.same_top1 < 1.0);
}
