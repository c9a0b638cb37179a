//! MTP speculative decoding on the CPU, on a tiny synthetic model with an MTP block:
//! greedy output equals plain greedy output token for token (drafts 1-3, the real MTP
//! block and an oracle drafter that forces accepted, partly accepted and rejected steps),
//! temperature sampling keeps its distribution (chi-square against the exact one), and
//! files without the block are refused clearly.

use std::sync::Arc;

use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::generate::{generate, GenerateRequest, StopReason};
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::sampling::{Sampler, SamplingParams};
use redlite_engine::session::{Runner, Session};
use redlite_engine::speculative::{judge, Speculator, Step};
use redlite_engine::state::KvType;
use redlite_engine::synth::{write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_engine::tokenizer::Tokenizer;
use redlite_engine::EngineError;
use redlite_gguf::GgufModel;

mod mtp_support;

fn tiny_model(dir: &std::path::Path, mtp: bool) -> Arc<GgufModel> {
    let mut config = Preset::Tiny.config();
    config.n_mtp = usize::from(mtp);
    let opts = SynthOptions {
        config,
        recipe: Recipe::F32,
        vocab: VocabChoice::Tiny,
        seed: 5,
    };
    let path = dir.join(format!("tiny-mtp{mtp}.gguf"));
    write_synth(&path, &opts, &mut |_, _| {}).unwrap();
    Arc::new(GgufModel::open(&path).unwrap())
}

fn session(gguf: &Arc<GgufModel>, mtp: bool, chunk: usize) -> Session<CpuBackend> {
    let config = config_from_gguf(gguf).unwrap();
    let mut backend = CpuBackend::new(gguf.clone(), config).unwrap();
    if mtp {
        backend.load_mtp().unwrap();
    }
    let mut s = Session::new(backend, 256, KvType::F32, chunk).unwrap();
    if mtp {
        s.enable_mtp().unwrap();
    }
    s
}

fn prompt(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| (i * 37 + 11) % 500).collect()
}

fn run(
    session: &mut dyn Runner,
    tok: &Tokenizer,
    prompt: &[u32],
    n: usize,
    draft: usize,
) -> (Vec<u32>, StopReason) {
    let req = GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens: n,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        render_special: false,
        draft,
    };
    let stats = generate(session, tok, &req, &mut |_| true).unwrap();
    if draft > 0 {
        let m = stats.mtp.unwrap();
        assert!(m.steps > 0 && m.drafted >= m.steps && m.drafted <= draft * m.steps);
    }
    (stats.generated, stats.stop)
}

#[test]
fn greedy_output_is_unchanged_by_mtp() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), true);
    let tok = Tokenizer::from_metadata(gguf.metadata()).unwrap();
    // A prompt longer than the chunk: the MTP block catches up chunk by chunk.
    let p = prompt(23);
    let mut plain = session(&gguf, false, 8);
    let (want, _) = run(&mut plain, &tok, &p, 48, 0);
    assert_eq!(want.len(), 48);
    for draft in 1..=3 {
        let mut s = session(&gguf, true, 8);
        let (got, _) = run(&mut s, &tok, &p, 48, draft);
        assert_eq!(got, want, "draft {draft}");
        // The session is where plain decoding leaves it: a second turn continues alike.
        let (more, _) = run(&mut s, &tok, &[7, 8], 9, draft);
        let (more_plain, _) = run(&mut plain_after(&gguf, &p, &want), &tok, &[7, 8], 9, 0);
        assert_eq!(more, more_plain, "second turn, draft {draft}");
    }
}

/// On a model whose MTP block agrees with the trunk about half of the time, greedy
/// generation keeps drafts (all, some, none) and still equals plain greedy generation.
#[test]
fn greedy_output_with_kept_drafts_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = Arc::new(GgufModel::open(mtp_support::agreeing_model(dir.path())).unwrap());
    let tok = Tokenizer::from_metadata(gguf.metadata()).unwrap();
    let p = prompt(19);
    let (want, _) = run(&mut session(&gguf, false, 8), &tok, &p, 60, 0);
    assert!(want.iter().all(|&t| (t as usize) < mtp_support::TOKENS));
    for draft in 1..=3 {
        let mut s = session(&gguf, true, 8);
        let req = GenerateRequest {
            prompt: p.clone(),
            max_tokens: 60,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            render_special: false,
            draft,
        };
        let stats = generate(&mut s, &tok, &req, &mut |_| true).unwrap();
        assert_eq!(stats.generated, want, "draft {draft}");
        let m = stats.mtp.unwrap();
        assert!(
            m.accepted > 0 && m.accepted < m.drafted,
            "draft {draft}: {m:?} should keep some drafts and reject others"
        );
    }
}

/// A plain session that has run `prompt` and decoded `generated` as `generate` leaves it
/// after a `Length` stop (the last token not fed).
fn plain_after(gguf: &Arc<GgufModel>, prompt: &[u32], generated: &[u32]) -> Session<CpuBackend> {
    let mut s = session(gguf, false, 8);
    let mut all = prompt.to_vec();
    all.extend_from_slice(&generated[..generated.len() - 1]);
    s.feed(&all, false, false).unwrap();
    s
}

/// Drives the session API with an oracle that drafts the plain greedy continuation, wrong
/// at chosen steps: every accept length (all, some, none) and the rollback are exercised,
/// and the output still equals plain greedy decoding.
#[test]
fn oracle_drafts_accept_and_roll_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), true);
    let p = prompt(11);
    let n_total = 40;
    let mut plain = session(&gguf, false, 16);
    let mut greedy = Sampler::new(SamplingParams::greedy()).unwrap();
    let mut logits = plain.feed(&p, false, false).unwrap().logits;
    let mut want = Vec::new();
    for _ in 0..n_total {
        let t = greedy.sample(&logits).unwrap();
        want.push(t);
        logits = plain.step(t).unwrap().to_vec();
    }
    let final_plain = logits;

    for draft in 1..=3 {
        let mut s = session(&gguf, true, 16);
        let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
        let logits = s.feed(&p, false, false).unwrap().logits;
        let mut out = vec![sampler.sample(&logits).unwrap()];
        let mut step = 0usize;
        let mut accepted_lengths = std::collections::BTreeSet::new();
        while out.len() < n_total {
            let n = draft.min(n_total - out.len());
            let at = out.len();
            // Wrong at draft index (step % (draft + 1)): index `draft` means all right.
            let wrong = step % (draft + 1);
            let mut k = 0;
            let drafts = s
                .mtp_draft(out[at - 1], n, &mut |_| {
                    let right = want[at + k];
                    let d = if k == wrong {
                        (right + 1) % 1000
                    } else {
                        right
                    };
                    k += 1;
                    Ok(d)
                })
                .unwrap();
            let mut batch = vec![out[at - 1]];
            batch.extend_from_slice(&drafts);
            let rows = s.mtp_verify(&batch).unwrap();
            let vocab = rows.len() / batch.len();
            let mut a = 0;
            while a < n && sampler.sample(&rows[a * vocab..(a + 1) * vocab]).unwrap() == drafts[a] {
                a += 1;
            }
            let next = sampler.sample(&rows[a * vocab..(a + 1) * vocab]).unwrap();
            s.mtp_accept(a).unwrap();
            accepted_lengths.insert(a);
            out.extend_from_slice(&drafts[..a]);
            out.push(next);
            step += 1;
        }
        out.truncate(n_total);
        assert_eq!(out, want, "draft {draft}");
        assert_eq!(
            accepted_lengths.len(),
            draft + 1,
            "draft {draft}: {accepted_lengths:?}"
        );
        // Feed the last token: the state and logits equal the plain session's.
        if s.pos() == p.len() + n_total - 1 {
            let last = s.step(out[n_total - 1]).unwrap();
            let diff = last
                .iter()
                .zip(&final_plain)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(diff < 1e-4, "draft {draft}: logits differ by {diff}");
        }
    }
}

/// Chi-square statistic of `counts` against probabilities `p` (bins with an expected count
/// under 5 pooled), and its degrees of freedom.
fn chi_square(
    counts: &std::collections::HashMap<u32, usize>,
    p: &[(u32, f64)],
    n: usize,
) -> (f64, usize) {
    let (mut chi, mut bins) = (0.0, 0usize);
    let (mut pooled_expected, mut pooled_seen) = (0.0, 0usize);
    for &(t, pt) in p {
        let expected = pt * n as f64;
        let seen = counts.get(&t).copied().unwrap_or(0);
        if expected < 5.0 {
            pooled_expected += expected;
            pooled_seen += seen;
        } else {
            chi += (seen as f64 - expected).powi(2) / expected;
            bins += 1;
        }
    }
    let outside: usize = counts
        .iter()
        .filter(|(t, _)| !p.iter().any(|e| e.0 == **t))
        .map(|(_, c)| *c)
        .sum();
    assert_eq!(
        outside, 0,
        "tokens outside the target distribution were drawn"
    );
    if pooled_expected > 0.0 {
        chi += (pooled_seen as f64 - pooled_expected).powi(2) / pooled_expected.max(1e-9);
        bins += 1;
    }
    (chi, bins.saturating_sub(1))
}

/// A loose bound (p < 1e-6 for any df): df + 7 sqrt(2 df) + 25.
fn chi_bound(df: usize) -> f64 {
    df as f64 + 7.0 * (2.0 * df as f64).sqrt() + 25.0
}

#[test]
fn acceptance_rule_samples_the_target_distribution() {
    // Synthetic p and q with partial overlap; the rule's output must follow p.
    let p = vec![(0u32, 0.4), (1, 0.3), (2, 0.2), (3, 0.1)];
    let q = vec![(1u32, 0.1), (2, 0.5), (3, 0.2), (4, 0.2)];
    let mut sampler = Sampler::new(SamplingParams {
        seed: 3,
        ..SamplingParams::default()
    })
    .unwrap();
    let n = 40_000;
    let mut counts = std::collections::HashMap::new();
    for _ in 0..n {
        let d = sampler.draw_from(&q);
        let t = judge(&mut sampler, &p, &q, d).unwrap_or(d);
        *counts.entry(t).or_insert(0) += 1;
    }
    let (chi, df) = chi_square(&counts, &p, n);
    assert!(chi < chi_bound(df), "chi-square {chi:.1} with {df} df");
    // An argmax draft (`serve` with REDLITE_MTP_ARGMAX_DRAFTS=1): a one-hot q at a token p
    // does not favour; the output still follows p.
    let mut counts = std::collections::HashMap::new();
    let one_hot = vec![(2u32, 1.0)];
    for _ in 0..n {
        let t = judge(&mut sampler, &p, &one_hot, 2).unwrap_or(2);
        *counts.entry(t).or_insert(0) += 1;
    }
    let (chi, df) = chi_square(&counts, &p, n);
    assert!(
        chi < chi_bound(df),
        "one-hot q: chi-square {chi:.1} with {df} df"
    );
    // Greedy: one-hot p and q keep a draft only when it is the argmax.
    let one = |t| vec![(t, 1.0)];
    assert_eq!(judge(&mut sampler, &one(5), &one(5), 5), None);
    assert_eq!(judge(&mut sampler, &one(5), &one(6), 6), Some(5));
}

/// End to end on the model: after a fixed first token, the next emitted token (a kept
/// draft or the replacement) over many seeds follows the trunk's exact distribution, with
/// the block's largest logits as drafts (the default) and with sampled drafts.
/// A random block's largest logit is rarely a token the random trunk samples: the argmax
/// drafts run on the model whose trunk tells only a few tokens apart, after a token where
/// the first draft has ~10 % of the trunk's probability.
#[test]
fn temperature_sampling_keeps_the_distribution_with_argmax_drafts() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = Arc::new(GgufModel::open(mtp_support::agreeing_model(dir.path())).unwrap());
    sampling_keeps_the_distribution(&gguf, (10, 2.0), false);
}

/// Hot enough that the random trunk and MTP block overlap: drafts are kept and rejected.
#[test]
fn temperature_sampling_keeps_the_distribution_with_sampled_drafts() {
    let dir = tempfile::tempdir().unwrap();
    sampling_keeps_the_distribution(&tiny_model(dir.path(), true), (17, 4.0), true);
}

/// The token after the prompt and `first`, sampled at `temperature` with two drafts.
fn sampling_keeps_the_distribution(
    gguf: &Arc<GgufModel>,
    (first, temperature): (u32, f32),
    sampled_drafts: bool,
) {
    let p_tokens = prompt(5);
    let params = |seed| SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplingParams::default()
    };
    // The exact target distribution of the token after `first`.
    let mut plain = session(gguf, false, 16);
    let mut with_first = p_tokens.clone();
    with_first.push(first);
    let logits = plain.feed(&with_first, false, false).unwrap().logits;
    let mut s0 = Sampler::new(params(0)).unwrap();
    for &t in &with_first {
        s0.accept(t);
    }
    let target = s0.distribution(&logits).unwrap();

    let mut s = session(gguf, true, 16);
    let n = 1500;
    let mut counts = std::collections::HashMap::new();
    let mut kept = 0;
    for seed in 0..n {
        s.reset();
        s.feed(&p_tokens, false, false).unwrap();
        let mut sampler = Sampler::new(params(seed as u64 + 1)).unwrap();
        for &t in &with_first {
            sampler.accept(t);
        }
        let mut spec = Speculator::new(2, None).unwrap();
        spec.argmax_drafts = !sampled_drafts;
        let mut emitted = None;
        let step = spec
            .step(&mut s, &mut sampler, first, 2, &mut |d| {
                emitted.get_or_insert(d);
                Ok(Some(StopReason::Length))
            })
            .unwrap();
        let t = match (emitted, step) {
            (Some(d), Step::Stop(_)) => {
                kept += 1;
                d
            }
            (None, Step::Next(t)) => t,
            _ => panic!("a step either emits a kept draft or returns a replacement"),
        };
        *counts.entry(t).or_insert(0) += 1;
    }
    assert!(
        kept > n / 20 && kept < n - n / 20,
        "both paths must be exercised: {kept} of {n} drafts kept (sampled drafts: {sampled_drafts})"
    );
    let (chi, df) = chi_square(&counts, &target, n);
    assert!(
        chi < chi_bound(df),
        "chi-square {chi:.1} with {df} df (sampled drafts: {sampled_drafts})"
    );
}

#[test]
fn a_file_without_the_mtp_block_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), false);
    let config = config_from_gguf(&gguf).unwrap();
    assert_eq!(config.n_mtp, 0);
    let mut backend = CpuBackend::new(gguf.clone(), config).unwrap();
    let err = backend.load_mtp().unwrap_err();
    assert!(matches!(err, EngineError::NoMtpBlock));
    assert!(err.to_string().contains("nextn_predict_layers"), "{err}");
    let mut s = Session::new(backend, 64, KvType::F32, 8).unwrap();
    assert!(matches!(s.enable_mtp(), Err(EngineError::NoMtpBlock)));
    // Without the block enabled, a speculative request is refused, not run plainly.
    let tok = Tokenizer::from_metadata(gguf.metadata()).unwrap();
    let req = GenerateRequest {
        prompt: prompt(3),
        max_tokens: 4,
        sampling: SamplingParams::greedy(),
        stop: Vec::new(),
        render_special: false,
        draft: 1,
    };
    assert!(generate(&mut s, &tok, &req, &mut |_| true).is_err());
}

#[test]
fn forced_acceptance_sets_the_rate() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), true);
    let mut s = session(&gguf, true, 16);
    let r =
        redlite_engine::bench::bench_gen_mtp(&mut s, 120, (4, 1), (1, Some(0.7)), None).unwrap();
    let m = r.mtp.unwrap();
    assert!(m.stats.drafted > 40);
    assert!(
        (m.acceptance_rate - 0.7).abs() < 0.2,
        "{}",
        m.acceptance_rate
    );
    let r = redlite_engine::bench::bench_gen_mtp(&mut s, 30, (0, 1), (3, Some(1.0)), None).unwrap();
    let m = r.mtp.unwrap();
    assert_eq!(m.stats.accepted, m.stats.drafted);
}

/// The greedy draft and verification (ids only: `mtp_draft_greedy`, `mtp_verify_greedy`), and
/// the chained step (`mtp_greedy_step`: the CPU backend keeps its picks, so the drafts reach
/// the next draft and the verification as stand-ins the backend replaces), against the logits
/// API picking on the host: the same drafts and picks over rounds of 1 to 3 drafts keeping
/// all, some and none, then the same next logits.
#[test]
fn greedy_drafts_and_picks_equal_the_logits_api() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), true);
    let p = prompt(12);
    let mut by_logits = session(&gguf, true, 16);
    let (mut by_ids, mut chained) = (session(&gguf, true, 16), session(&gguf, true, 16));
    let argmax = |row: &[f32]| redlite_engine::sampling::greedy_argmax(row).unwrap();
    let mut next = argmax(&by_logits.feed(&p, false, false).unwrap().logits);
    by_ids.feed(&p, false, false).unwrap();
    chained.feed(&p, false, false).unwrap();
    for (round, draft) in [1usize, 3, 2, 3, 1].into_iter().enumerate() {
        let want = by_logits
            .mtp_draft(next, draft, &mut |logits| Ok(argmax(logits)))
            .unwrap();
        let got = by_ids.mtp_draft_greedy(next, draft).unwrap();
        assert_eq!(got, want, "round {round}: drafts");
        let mut batch = vec![next];
        batch.extend_from_slice(&want);
        let rows = by_logits.mtp_verify(&batch).unwrap();
        let want_picks: Vec<u32> = rows.chunks(rows.len() / batch.len()).map(argmax).collect();
        let picks = by_ids.mtp_verify_greedy(&batch).unwrap();
        assert_eq!(picks, want_picks, "round {round}: picks");
        let step = chained.mtp_greedy_step(next, draft).unwrap();
        assert_eq!(step.drafts, want, "round {round}: chained drafts");
        assert_eq!(step.picks, want_picks, "round {round}: chained picks");
        // Keep a different prefix each round (real drafts of random weights rarely match).
        let keep = [draft, 0, 1, 2, 0][round].min(draft);
        for s in [&mut by_logits, &mut by_ids, &mut chained] {
            s.mtp_accept(keep).unwrap();
        }
        next = want_picks[keep];
    }
    let pos = by_logits.pos();
    let want = by_logits.step(next).unwrap().to_vec();
    for (name, s) in [("ids", &mut by_ids), ("chained", &mut chained)] {
        assert_eq!(s.pos(), pos, "{name}");
        assert_eq!(s.step(next).unwrap(), &want[..], "{name}: the next logits");
    }
    // A step the session refuses leaves nothing kept behind: the next one is whole.
    assert!(chained.mtp_greedy_step(next, 4).is_err());
    let step = chained.mtp_greedy_step(argmax(&want), 1).unwrap();
    assert_eq!((step.drafts.len(), step.picks.len()), (1, 2));
}

/// The argmax step (`mtp_argmax_step`: the chained step, then its verification's logits)
/// against the logits API (drafts picked on the host, then `mtp_verify`): the same drafts
/// and the same logits, over rounds keeping all, some and none of 1 to 3 drafts.
#[test]
fn argmax_drafts_and_their_rows_equal_the_logits_api() {
    let dir = tempfile::tempdir().unwrap();
    let gguf = tiny_model(dir.path(), true);
    let p = prompt(12);
    let (mut by_logits, mut stepped) = (session(&gguf, true, 16), session(&gguf, true, 16));
    let argmax = |row: &[f32]| redlite_engine::sampling::greedy_argmax(row).unwrap();
    let mut next = argmax(&by_logits.feed(&p, false, false).unwrap().logits);
    stepped.feed(&p, false, false).unwrap();
    for (round, draft) in [2usize, 1, 3, 3, 2].into_iter().enumerate() {
        let want = by_logits
            .mtp_draft(next, draft, &mut |logits| Ok(argmax(logits)))
            .unwrap();
        let mut batch = vec![next];
        batch.extend_from_slice(&want);
        let rows = by_logits.mtp_verify(&batch).unwrap();
        let (drafts, got) = stepped.mtp_argmax_step(next, draft).unwrap();
        assert_eq!(drafts, want, "round {round}: drafts");
        assert_eq!(got, rows, "round {round}: the verification's logits");
        let keep = [draft, 0, 1, 2, 0][round].min(draft);
        by_logits.mtp_accept(keep).unwrap();
        stepped.mtp_accept(keep).unwrap();
        let vocab = rows.len() / batch.len();
        next = argmax(&rows[keep * vocab..(keep + 1) * vocab]);
    }
    let want = by_logits.step(next).unwrap().to_vec();
    assert_eq!(stepped.step(next).unwrap(), &want[..], "the next logits");
}
