//! The serving scheduler on the CPU: requests batched together produce exactly what each
//! produces alone (greedy), and what a single-sequence session produces; a second turn
//! ingests only its new tokens; a client that goes away frees its slot; a full queue refuses.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::generate::{generate, GenerateRequest, StopReason};
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::sampling::SamplingParams;
use redlite_engine::serve::{self, Event, Handle, SubmitError};
use redlite_engine::session::Session;
use redlite_engine::state::KvType;
use redlite_engine::synth::Recipe;

mod mtp_support;
mod serve_support;

use serve_support::{job, prompt, serve_config, tiny_model, wait, Model, CHUNK};

fn model() -> Model {
    model_with(false)
}

/// The tiny model, with the MTP block when `mtp`.
fn model_with(mtp: bool) -> Model {
    tiny_model(Recipe::Q4KM, mtp)
}

fn start(m: &Model, slots: usize, queue_limit: usize) -> Handle {
    start_mtp(m, slots, queue_limit, 0)
}

/// A scheduler drafting `draft` tokens per step with the MTP block (0: off).
fn start_mtp(m: &Model, slots: usize, queue_limit: usize, draft: usize) -> Handle {
    let gguf = m.gguf.clone();
    let config = config_from_gguf(&gguf).unwrap();
    serve::spawn(
        move || {
            let mut backend = CpuBackend::new(gguf, config)?;
            if draft > 0 {
                backend.load_mtp()?;
            }
            Ok(backend)
        },
        m.tokenizer.clone(),
        serve_config(slots, queue_limit, 4, draft),
    )
    .unwrap()
}

#[test]
fn batched_requests_equal_each_request_alone_and_a_plain_session() {
    let m = model();
    let prompts: Vec<Vec<u32>> = (0..8).map(|s| prompt(s, 5 + 3 * s as usize)).collect();
    // Alone: one slot, one request at a time.
    let alone = start(&m, 1, 16);
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let (j, rx, _) = job(p.clone(), 16);
            alone.submit(j).unwrap();
            wait(&rx).0
        })
        .collect();
    alone.shutdown();
    // The single-sequence path (the CLI's) gives the same tokens.
    let config = config_from_gguf(&m.gguf).unwrap();
    let mut session = Session::new(
        CpuBackend::new(m.gguf.clone(), config).unwrap(),
        256,
        KvType::F32,
        CHUNK,
    )
    .unwrap();
    for (p, want) in prompts.iter().zip(&reference) {
        session.reset();
        let req = GenerateRequest {
            prompt: p.clone(),
            max_tokens: 16,
            sampling: SamplingParams::greedy(),
            stop: Vec::new(),
            render_special: false,
            draft: 0,
        };
        let stats = generate(&mut session, &m.tokenizer, &req, &mut |_| true).unwrap();
        assert_eq!(&stats.generated, want, "session vs scheduler for {p:?}");
    }
    // Together: 3 slots, all 8 submitted at once (5 wait in the queue).
    let together = start(&m, 3, 16);
    let receivers: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (j, rx, _) = job(p.clone(), 16);
            together.submit(j).unwrap();
            rx
        })
        .collect();
    for (i, rx) in receivers.iter().enumerate() {
        let (ids, finish) = wait(rx);
        assert_eq!(ids, reference[i], "request {i} differs when batched");
        assert_eq!(finish.prompt_tokens, prompts[i].len());
        assert_eq!(finish.completion_tokens, ids.len());
    }
    let metrics = together.metrics();
    assert!(
        metrics.step_sequences > metrics.steps,
        "no step batched several sequences: {metrics:?}"
    );
    assert_eq!(metrics.requests_finished, 8);
    together.shutdown();
}

/// With the MTP block drafting (1 to 3 tokens), batched requests give exactly the plain
/// greedy tokens, and the metrics count the drafts; on a model whose MTP block agrees with
/// the trunk half of the time, drafts are kept too.
#[test]
fn serving_with_mtp_gives_the_plain_greedy_tokens() {
    serve_with_mtp(&model_with(true), false);
    let dir = tempfile::tempdir().unwrap();
    let path = mtp_support::agreeing_model(dir.path());
    let agreeing = Model::open(dir, &path);
    serve_with_mtp(&agreeing, true);
}

fn serve_with_mtp(m: &Model, keeps_drafts: bool) {
    let prompts: Vec<Vec<u32>> = (0..6).map(|s| prompt(s, 5 + 3 * s as usize)).collect();
    let plain = start(m, 2, 16);
    let reference: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let (j, rx, _) = job(p.clone(), 14);
            plain.submit(j).unwrap();
            wait(&rx).0
        })
        .collect();
    plain.shutdown();
    for draft in 1..=3 {
        let handle = start_mtp(m, 3, 16, draft);
        let receivers: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (j, rx, _) = job(p.clone(), 14);
                handle.submit(j).unwrap();
                rx
            })
            .collect();
        for (i, rx) in receivers.iter().enumerate() {
            let (ids, finish) = wait(rx);
            assert_eq!(ids, reference[i], "request {i}, draft {draft}");
            assert_eq!(finish.completion_tokens, ids.len());
        }
        let metrics = handle.metrics();
        assert!(metrics.mtp_steps > 0, "{metrics:?}");
        if keeps_drafts {
            assert!(
                metrics.mtp_accepted > 0 && metrics.mtp_accepted < metrics.mtp_drafted,
                "draft {draft}: {metrics:?}"
            );
        }
        assert!(metrics.mtp_drafted >= metrics.mtp_steps);
        assert!(metrics.mtp_drafted <= metrics.mtp_steps * draft as u64);
        handle.shutdown();
    }
}

#[test]
fn a_second_turn_ingests_only_its_new_tokens() {
    second_turn(&model(), 0);
}

#[test]
fn a_second_turn_with_mtp_ingests_only_its_new_tokens() {
    second_turn(&model_with(true), 2);
}

fn second_turn(m: &Model, draft: usize) {
    let handle = start_mtp(m, 2, 8, draft);
    let turn1 = prompt(1, 20);
    let (j, rx, _) = job(turn1.clone(), 6);
    handle.submit(j).unwrap();
    let (out1, f1) = wait(&rx);
    assert_eq!(f1.cached_tokens, 0);
    // The next turn repeats the conversation so far and adds a new message.
    let mut turn2 = turn1.clone();
    turn2.extend(&out1);
    turn2.extend(prompt(2, 7));
    let before = handle.metrics().prefill_tokens;
    let (j, rx, _) = job(turn2.clone(), 4);
    handle.submit(j).unwrap();
    let (_, f2) = wait(&rx);
    let fed_in_turn1 = turn1.len() + out1.len() - usize::from(f1.reason == StopReason::Length);
    assert_eq!(f2.cached_tokens, fed_in_turn1);
    let ingested = handle.metrics().prefill_tokens - before;
    assert_eq!(ingested as usize, turn2.len() - fed_in_turn1);
    // The same prompt again (a regenerated answer) needs no prompt token at all and gives
    // the same greedy answer.
    let before = handle.metrics().prefill_tokens;
    let (j, rx, _) = job(turn2.clone(), 4);
    handle.submit(j).unwrap();
    let (again, f3) = wait(&rx);
    assert_eq!(f3.cached_tokens, turn2.len());
    assert_eq!(handle.metrics().prefill_tokens, before);
    let (j, rx, _) = job(turn2.clone(), 4);
    let fresh = start(m, 1, 1);
    fresh.submit(j).unwrap();
    assert_eq!(
        wait(&rx).0,
        again,
        "a regenerated answer differs from a fresh one"
    );
    fresh.shutdown();
    // A different conversation in the other slot does not disturb the first one's cache.
    let (j, rx, _) = job(prompt(9, 12), 3);
    handle.submit(j).unwrap();
    assert_eq!(wait(&rx).1.cached_tokens, 0);
    handle.shutdown();
}

#[test]
fn a_client_that_goes_away_frees_its_slot_and_a_full_queue_refuses() {
    let m = model();
    let handle = start(&m, 1, 1);
    let (j, rx, closed) = job(prompt(3, 10), 200);
    handle.submit(j).unwrap();
    // Wait for the first token, then leave.
    loop {
        if let Event::Token { .. } = rx.recv_timeout(Duration::from_secs(60)).unwrap() {
            break;
        }
    }
    // The slot is busy: one request may wait, the next is refused.
    let (waiting, waiting_rx, _) = job(prompt(4, 6), 2);
    handle.submit(waiting).unwrap();
    let (refused, _, _) = job(prompt(5, 6), 2);
    assert!(matches!(
        handle.submit(refused),
        Err(SubmitError::QueueFull { .. })
    ));
    closed.store(true, Ordering::SeqCst);
    let (_, f) = wait(&waiting_rx);
    assert_eq!(f.completion_tokens, 2);
    let deadline = Instant::now() + Duration::from_secs(10);
    while handle.metrics().busy_slots != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let metrics = handle.metrics();
    assert_eq!(metrics.requests_cancelled, 1, "{metrics:?}");
    assert_eq!(metrics.requests_rejected, 1);
    assert_eq!(metrics.busy_slots, 0);
    // Bad requests are refused before they take a slot.
    let (long, _, _) = job(prompt(6, 300), 1);
    assert!(matches!(
        handle.submit(long),
        Err(SubmitError::PromptTooLong { .. })
    ));
    let (too_many, _, _) = job(prompt(6, 200), 100);
    assert!(matches!(
        handle.submit(too_many),
        Err(SubmitError::TooManyTokens { .. })
    ));
    handle.shutdown();
}
