use super::*;

fn params(temperature: f32) -> SamplingParams {
    SamplingParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::default()
    }
}

fn histogram(sampler: &mut Sampler, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        counts[sampler.sample(logits).expect("sample") as usize] += 1;
    }
    counts
}

#[test]
fn greedy_picks_argmax_lowest_id_on_ties() {
    let mut s = Sampler::new(SamplingParams::greedy()).expect("sampler");
    assert_eq!(s.sample(&[0.1, 2.0, -1.0, 2.0]).expect("sample"), 1);
    assert_eq!(
        s.sample(&[f32::NEG_INFINITY, f32::NAN, -3.0])
            .expect("sample"),
        2
    );
    assert!(matches!(s.sample(&[]), Err(SamplingError::EmptyLogits)));
    assert!(matches!(
        s.sample(&[f32::NEG_INFINITY, f32::NAN]),
        Err(SamplingError::NoFiniteLogit { count: 2 })
    ));
}

#[test]
fn same_seed_same_tokens() {
    let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 20.0).collect();
    let run = |seed| {
        let mut s = Sampler::new(SamplingParams {
            seed,
            ..SamplingParams::default()
        })
        .expect("sampler");
        (0..50)
            .map(|_| s.sample(&logits).expect("sample"))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn temperature_follows_softmax() {
    // p = softmax([0, ln 2, ln 3] / T); at T = 1: 1/6, 2/6, 3/6.
    let logits = [0.0, 2f32.ln(), 3f32.ln()];
    let mut s = Sampler::new(params(1.0)).expect("sampler");
    let counts = histogram(&mut s, &logits, 60_000);
    for (count, expected) in counts.iter().zip([1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0]) {
        let p = *count as f64 / 60_000.0;
        assert!((p - expected).abs() < 0.01, "{counts:?}");
    }
    // Low temperature sharpens towards the argmax.
    let mut s = Sampler::new(params(0.05)).expect("sampler");
    let counts = histogram(&mut s, &logits, 2_000);
    assert!(counts[2] > 1_990, "{counts:?}");
}

#[test]
fn top_k_top_p_min_p_truncate() {
    let logits = [3.0, 2.0, 1.0, 0.0, -1.0];
    let draws = 5_000;
    let mut s = Sampler::new(SamplingParams {
        top_k: 2,
        ..params(1.0)
    })
    .expect("sampler");
    let counts = histogram(&mut s, &logits, draws);
    assert!(counts[0] > 0 && counts[1] > 0 && counts[2..].iter().all(|&c| c == 0));

    // softmax: 0.636, 0.234, 0.086, ...: top_p 0.8 keeps two tokens, 0.5 keeps one.
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.8,
        ..params(1.0)
    })
    .expect("sampler");
    let counts = histogram(&mut s, &logits, draws);
    assert!(
        counts[1] > 0 && counts[2..].iter().all(|&c| c == 0),
        "{counts:?}"
    );
    let mut s = Sampler::new(SamplingParams {
        top_p: 0.5,
        ..params(1.0)
    })
    .expect("sampler");
    assert_eq!(histogram(&mut s, &logits, 100)[0], 100);

    // min_p 0.3: keeps p >= 0.3 * p_max, i.e. logit >= 3 + ln 0.3 = 1.80.
    let mut s = Sampler::new(SamplingParams {
        min_p: 0.3,
        ..params(1.0)
    })
    .expect("sampler");
    let counts = histogram(&mut s, &logits, draws);
    assert!(
        counts[1] > 0 && counts[2..].iter().all(|&c| c == 0),
        "{counts:?}"
    );
}

#[test]
fn penalties_follow_llama_cpp() {
    let base = SamplingParams {
        repeat_penalty: 2.0,
        frequency_penalty: 0.5,
        presence_penalty: 0.25,
        ..SamplingParams::greedy()
    };
    let mut candidates = vec![(0, 4.0), (1, -1.0), (2, 3.0)];
    let counts: HashMap<u32, u32> = [(0, 2), (1, 1)].into_iter().collect();
    apply_penalties(&mut candidates, &counts, &base);
    // 4 / 2 - 2 * 0.5 - 0.25 = 0.75;  -1 * 2 - 0.5 - 0.25 = -2.75; 3 untouched.
    assert_eq!(candidates, vec![(0, 0.75), (1, -2.75), (2, 3.0)]);

    let mut s = Sampler::new(base).expect("sampler");
    let logits = [4.0, -1.0, 3.0];
    assert_eq!(s.sample(&logits).expect("sample"), 0);
    s.accept(0);
    assert_eq!(s.sample(&logits).expect("sample"), 2);
}

#[test]
fn penalty_window_forgets_old_tokens() {
    let mut s = Sampler::new(SamplingParams {
        repeat_penalty: 10.0,
        penalty_last_n: 2,
        ..SamplingParams::greedy()
    })
    .expect("sampler");
    let logits = [5.0, 1.0];
    s.accept(0);
    assert_eq!(s.sample(&logits).expect("sample"), 1);
    s.accept(1);
    s.accept(1);
    // Token 0 left the window of two.
    assert_eq!(s.sample(&logits).expect("sample"), 0);
}

#[test]
fn invalid_params_are_refused() {
    for bad in [
        SamplingParams {
            temperature: -1.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            top_p: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            min_p: 1.5,
            ..SamplingParams::default()
        },
        SamplingParams {
            repeat_penalty: 0.0,
            ..SamplingParams::default()
        },
        SamplingParams {
            presence_penalty: f32::NAN,
            ..SamplingParams::default()
        },
    ] {
        assert!(matches!(
            Sampler::new(bad),
            Err(SamplingError::BadParam { .. })
        ));
    }
}

/// The greedy fast path (no candidates) picks what the candidate path picks.
#[test]
fn greedy_fast_path_equals_the_candidate_path() {
    let mut rng = Rng::new(9);
    let mut fast = Sampler::new(SamplingParams::greedy()).expect("sampler");
    for case in 0..200 {
        let mut logits: Vec<f32> = (0..64).map(|_| (rng.next_f64() * 4.0) as f32).collect();
        logits[case % 64] = f32::NAN;
        logits[(case * 7) % 64] = f32::INFINITY;
        logits[(case * 3) % 64] = logits[(case * 5) % 64];
        let mut slow = Sampler::new(SamplingParams::greedy()).expect("sampler");
        slow.prepare(&logits).expect("prepare");
        let want = argmax(&slow.candidates);
        assert_eq!(fast.sample(&logits).expect("sample"), want, "case {case}");
        assert_eq!(
            fast.distribution(&logits).expect("distribution"),
            vec![(want, 1.0)]
        );
    }
}

/// The candidates before top-k's one-pass form (`top_k.rs`): every non-NaN logit, penalized,
/// the finite ones, then the k best by selection over all of them, top-p and min-p.
fn reference_candidates(logits: &[f32], s: &Sampler) -> Vec<(u32, f32)> {
    let p = &s.params;
    let mut c: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| !l.is_nan())
        .map(|(id, &l)| (id as u32, l))
        .collect();
    apply_penalties(&mut c, &s.counts, p);
    c.retain(|(_, l)| l.is_finite());
    top_k(&mut c, p.top_k, &mut Vec::new());
    top_p(&mut c, p.top_p);
    min_p(&mut c, p.min_p);
    c
}

#[test]
fn one_pass_top_k_keeps_the_candidates_of_the_whole_row_selection() {
    let mut rng = Rng::new(7);
    for case in 0..300 {
        let n = [1, 5, 40, 41, 200, 4096][case % 6];
        // Few distinct values (ties), zeros of both signs, NaN and infinities among them.
        let logits: Vec<f32> = (0..n)
            .map(|_| match (rng.next_f64() * 20.0) as u32 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => -0.0,
                4 => 0.0,
                v => ((rng.next_f64() * 8.0).floor() as f32 - 4.0) * (v as f32 / 10.0),
            })
            .collect();
        let params = SamplingParams {
            top_k: [1, 3, 40, 64, usize::MAX][case % 5],
            top_p: [1.0, 0.95, 0.5][case % 3],
            min_p: [0.0, 0.05][case % 2],
            repeat_penalty: [1.0, 1.3][(case / 2) % 2],
            presence_penalty: [0.0, 0.5][(case / 3) % 2],
            penalty_last_n: 8,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params).expect("sampler");
        for _ in 0..6 {
            s.accept((rng.next_f64() * (n as f64 + 3.0)) as u32);
        }
        let expected = reference_candidates(&logits, &s);
        match s.prepare(&logits) {
            Ok(()) => assert_eq!(s.candidates, expected, "case {case}: {logits:?}"),
            Err(SamplingError::NoFiniteLogit { count }) => {
                assert!(expected.is_empty() && count == n, "case {case}")
            }
            Err(e) => panic!("case {case}: {e}"),
        }
    }
}

#[test]
fn one_pass_top_k_orders_zeros_by_sign_and_ties_by_id() {
    // +0 ranks before -0 (`total_cmp`), so the +0s after the first trim's bar of -0 get in.
    let mut logits = vec![-0.0f32; 10];
    logits.extend([0.0f32; 10]);
    let params = SamplingParams {
        top_k: 3,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplingParams::default()
    };
    let mut s = Sampler::new(params).expect("sampler");
    s.prepare(&logits).expect("prepare");
    let ids: Vec<u32> = s.candidates.iter().map(|c| c.0).collect();
    assert_eq!(ids, [10, 11, 12]);
    assert_eq!(s.candidates, reference_candidates(&logits, &s));
}

#[test]
fn greedy_argmax_skipping_chunks_is_the_first_largest_finite_logit() {
    let mut rng = Rng::new(11);
    for case in 0..200 {
        let n = [1, 63, 64, 65, 500, 5000][case % 6];
        let logits: Vec<f32> = (0..n)
            .map(|_| match (rng.next_f64() * 12.0) as u32 {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => -0.0,
                _ => (rng.next_f64() * 6.0).floor() as f32,
            })
            .collect();
        let mut expected: Option<(u32, f32)> = None;
        for (id, &l) in logits.iter().enumerate() {
            if l.is_finite() && expected.is_none_or(|b| l > b.1) {
                expected = Some((id as u32, l));
            }
        }
        match (greedy_argmax(&logits), expected) {
            (Ok(token), Some((id, _))) => assert_eq!(token, id, "case {case}"),
            (Err(SamplingError::NoFiniteLogit { .. }), None) => {}
            (got, want) => panic!("case {case}: {got:?} against {want:?}"),
        }
    }
}

#[test]
fn the_radix_sort_of_a_whole_row_is_the_comparison_sort() {
    let mut rng = Rng::new(13);
    // One second buffer for every row, as a sampler keeps it.
    let mut spare = Vec::new();
    for case in 0..12 {
        let n = [4096, 5000, 151_936][case % 3];
        // Few distinct values (long runs of ties), both zeros, infinities and NaNs of both signs.
        let row: Vec<(u32, f32)> = (0..n as u32)
            .map(|id| {
                let l = match (rng.next_f64() * 40.0) as u32 {
                    0 => f32::NAN,
                    1 => -f32::NAN,
                    2 => f32::INFINITY,
                    3 => f32::NEG_INFINITY,
                    4 => -0.0,
                    5 => 0.0,
                    v if case % 2 == 0 => (v % 7) as f32 - 3.0,
                    _ => (rng.next_f64() * 200.0 - 100.0) as f32,
                };
                (id, l)
            })
            .collect();
        let mut expected = row.clone();
        expected.sort_unstable_by(by_logit_desc);
        let mut sorted = row;
        sort::sort_by_logit_desc(&mut sorted, &mut spare);
        let bits = |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
        assert_eq!(bits(&sorted), bits(&expected), "case {case}");
    }
}
