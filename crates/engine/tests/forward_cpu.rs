//! CPU forward pass: chunk sizes agree, decode equals prefill, f16 KV drift is small,
//! snapshots restore exactly, and a prompt past the context is refused.

use std::sync::Arc;

use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::model::DeltaNetLayout;
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::GgufModel;

fn tiny_model(dir: &std::path::Path, recipe: Recipe, layout: DeltaNetLayout) -> Arc<GgufModel> {
    let mut config = Preset::Tiny.config();
    config.layout = layout;
    let opts = SynthOptions {
        config,
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 11,
    };
    let path = dir.join(format!("{}-{layout:?}.gguf", recipe.name()));
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    Arc::new(GgufModel::open(&path).unwrap())
}

fn session(gguf: &Arc<GgufModel>, ctx: usize, kv: KvType, chunk: usize) -> Session<CpuBackend> {
    let config = config_from_gguf(gguf).unwrap();
    Session::new(
        CpuBackend::new(gguf.clone(), config).unwrap(),
        ctx,
        kv,
        chunk,
    )
    .unwrap()
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 500).collect()
}

/// Largest relative L2 difference over positions.
fn max_rel(a: &[f32], b: &[f32], vocab: usize) -> f32 {
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            let num: f32 = x.iter().zip(y).map(|(p, q)| (p - q).powi(2)).sum();
            let den: f32 = x.iter().map(|p| p * p).sum();
            (num / den).sqrt()
        })
        .fold(0.0, f32::max)
}

#[test]
fn chunk_sizes_give_the_same_logits() {
    let dir = tempfile::tempdir().unwrap();
    for layout in [DeltaNetLayout::Split, DeltaNetLayout::Legacy] {
        let gguf = tiny_model(dir.path(), Recipe::F32, layout);
        let tokens = prompt(200);
        let mut reference = session(&gguf, 256, KvType::F32, 512);
        let base = reference.feed(&tokens, true, false).unwrap().logits;
        let vocab = reference.n_vocab();
        assert_eq!(base.len(), 200 * vocab);
        for chunk in [1, 7, 64] {
            let mut s = session(&gguf, 256, KvType::F32, chunk);
            let got = s.feed(&tokens, true, false).unwrap().logits;
            let rel = max_rel(&base, &got, vocab);
            assert!(
                rel <= 1e-5,
                "{layout:?}: chunk {chunk} differs from chunk 512 by {rel:.2e}"
            );
        }
        // The logits differ from position to position (the model is not flat).
        let spread = max_rel(&base[..vocab], &base[vocab..2 * vocab], vocab);
        assert!(spread > 0.1, "positions 0 and 1 are too similar: {spread}");
    }
}

#[test]
fn decode_continues_a_prefill_exactly_as_one_prefill() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), Recipe::IQ2XXS, DeltaNetLayout::Split);
    let tokens = prompt(40);
    let mut whole = session(&gguf, 64, KvType::F32, 512);
    let all = whole.feed(&tokens, true, false).unwrap().logits;
    let vocab = whole.n_vocab();
    let mut stepwise = session(&gguf, 64, KvType::F32, 512);
    stepwise.feed(&tokens[..30], false, false).unwrap();
    for (i, &t) in tokens[30..].iter().enumerate() {
        let logits = stepwise.step(t).unwrap();
        let pos = 30 + i;
        let rel = max_rel(&all[pos * vocab..(pos + 1) * vocab], logits, vocab);
        assert!(
            rel <= 1e-5,
            "position {pos}: decode differs from prefill by {rel:.2e}"
        );
    }
}

#[test]
fn snapshot_restores_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), Recipe::F32, DeltaNetLayout::Split);
    let tokens = prompt(20);
    let mut s = session(&gguf, 64, KvType::F32, 8);
    s.feed(&tokens[..10], false, false).unwrap();
    let snap = s.state.snapshot();
    let first = s.feed(&tokens[10..], true, false).unwrap().logits;
    s.state.restore(&snap);
    let again = s.feed(&tokens[10..], true, false).unwrap().logits;
    assert_eq!(first, again);
    s.state.reset();
    assert_eq!(s.pos(), 0);
}

#[test]
fn f16_kv_drift_is_small() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), Recipe::F32, DeltaNetLayout::Split);
    let tokens = prompt(200);
    let a = session(&gguf, 256, KvType::F32, 64)
        .feed(&tokens, true, false)
        .unwrap()
        .logits;
    let mut s16 = session(&gguf, 256, KvType::F16, 64);
    let b = s16.feed(&tokens, true, false).unwrap().logits;
    let rel = max_rel(&a, &b, s16.n_vocab());
    println!("f16 KV vs f32 KV, 200 tokens: max relative L2 per position {rel:.2e}");
    assert!(rel < 1e-2, "f16 KV drifts by {rel}");
}

#[test]
fn a_prompt_past_the_context_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), Recipe::F32, DeltaNetLayout::Split);
    let mut s = session(&gguf, 16, KvType::F32, 8);
    let err = s.feed(&prompt(17), false, false).unwrap_err().to_string();
    assert!(err.contains("17") && err.contains("16"), "{err}");
    assert_eq!(
        s.pos(),
        0,
        "a refused prompt must leave the state untouched"
    );
    let err = s.feed(&[5000], false, false).unwrap_err().to_string();
    assert!(err.contains("5000"), "{err}");
}

/// A greedy step (`step_greedy`: the CPU backend hands the logits over, the session takes
/// their argmax) picks the largest logit of the same step through `step`, and leaves the
/// session where `step` does.
#[test]
fn a_greedy_step_picks_the_argmax_of_a_plain_step() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), Recipe::IQ2XXS, DeltaNetLayout::Split);
    let tokens = prompt(24);
    let mut plain = session(&gguf, 64, KvType::F32, 16);
    let mut greedy = session(&gguf, 64, KvType::F32, 16);
    plain.feed(&tokens[..8], false, false).unwrap();
    greedy.feed(&tokens[..8], false, false).unwrap();
    for (i, &t) in tokens[8..].iter().enumerate() {
        let want = redlite_engine::sampling::greedy_argmax(plain.step(t).unwrap()).unwrap();
        assert_eq!(greedy.step_greedy(t).unwrap(), want, "step {i}");
    }
    assert_eq!(plain.pos(), greedy.pos());
}
