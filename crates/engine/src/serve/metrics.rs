//! Counters the scheduler updates and `/metrics` reads: requests by outcome, tokens, prompt
//! reuse, batching, slot use, and the generation rate over the last seconds.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::generate::StopReason;

/// The window of the `tokens_per_second` gauge.
const RATE_WINDOW: Duration = Duration::from_secs(10);

#[derive(Default)]
struct Counters {
    submitted: AtomicU64,
    rejected: AtomicU64,
    finished: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    prompt_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    prefill_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    prefix_lookups: AtomicU64,
    prefix_hits: AtomicU64,
    steps: AtomicU64,
    step_rows: AtomicU64,
    step_sequences: AtomicU64,
    busy_slots: AtomicU64,
    max_queue: AtomicU64,
    mtp_steps: AtomicU64,
    mtp_drafted: AtomicU64,
    mtp_accepted: AtomicU64,
    cache_hits: AtomicU64,
    cache_misses: AtomicU64,
    cache_bytes: AtomicU64,
    cache_wait_ns: AtomicU64,
}

pub(super) struct Metrics {
    slots: usize,
    started: Instant,
    c: Counters,
    /// (when, tokens generated in that step) over the last `RATE_WINDOW`.
    recent: Mutex<VecDeque<(Instant, u64)>>,
}

/// A consistent-enough read of every counter.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetricsSnapshot {
    pub slots: usize,
    pub busy_slots: u64,
    pub queue_depth: usize,
    pub max_queue_depth: u64,
    pub requests_submitted: u64,
    pub requests_rejected: u64,
    pub requests_finished: u64,
    pub requests_cancelled: u64,
    pub requests_failed: u64,
    pub prompt_tokens: u64,
    /// Prompt tokens reused from snapshots (not ingested).
    pub cached_prompt_tokens: u64,
    /// Prompt tokens actually run through the model.
    pub prefill_tokens: u64,
    pub completion_tokens: u64,
    pub prefix_lookups: u64,
    pub prefix_hits: u64,
    pub steps: u64,
    /// Rows of all steps (tokens per forward call, summed).
    pub step_rows: u64,
    /// Sequences of all steps (the batch size, summed).
    pub step_sequences: u64,
    /// Generated tokens per second over the last ten seconds.
    pub tokens_per_second: f64,
    pub uptime_seconds: f64,
    /// MTP speculative decoding: draft-and-verify steps, drafted tokens, kept drafts.
    pub mtp_steps: u64,
    pub mtp_drafted: u64,
    pub mtp_accepted: u64,
    /// The GPU expert cache (with `--experts cache=...`): experts found on the GPU, copied
    /// in, the bytes copied, and the nanoseconds decoding waited for copies, as of the last
    /// finished request.
    pub expert_cache_hits: u64,
    pub expert_cache_misses: u64,
    pub expert_cache_bytes: u64,
    pub expert_cache_wait_ns: u64,
}

impl Metrics {
    pub fn new(slots: usize) -> Metrics {
        Metrics {
            slots,
            started: Instant::now(),
            c: Counters::default(),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    pub fn queued(&self, depth: usize) {
        self.c.submitted.fetch_add(1, Ordering::Relaxed);
        self.c.max_queue.fetch_max(depth as u64, Ordering::Relaxed);
    }

    pub fn rejected(&self) {
        self.c.rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// A job got a slot and reused `cached` of its `prompt` tokens.
    pub fn admitted(&self, prompt: usize, cached: usize) {
        self.c
            .prompt_tokens
            .fetch_add(prompt as u64, Ordering::Relaxed);
        self.c
            .cached_tokens
            .fetch_add(cached as u64, Ordering::Relaxed);
        self.c.prefix_lookups.fetch_add(1, Ordering::Relaxed);
        if cached > 0 {
            self.c.prefix_hits.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn ended(&self, reason: &StopReason) {
        let counter = match reason {
            StopReason::Cancelled => &self.c.cancelled,
            _ => &self.c.finished,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn failed(&self) {
        self.c.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// One forward call: `rows` tokens of `sequences` sequences, `prefill` of them prompt
    /// tokens, `generated` tokens sampled after it; `busy` slots hold a job.
    pub fn step(&self, rows: usize, sequences: usize, prefill: usize, generated: u64, busy: usize) {
        self.c.steps.fetch_add(1, Ordering::Relaxed);
        self.c.step_rows.fetch_add(rows as u64, Ordering::Relaxed);
        self.c
            .step_sequences
            .fetch_add(sequences as u64, Ordering::Relaxed);
        self.c
            .prefill_tokens
            .fetch_add(prefill as u64, Ordering::Relaxed);
        self.c
            .completion_tokens
            .fetch_add(generated, Ordering::Relaxed);
        self.c.busy_slots.store(busy as u64, Ordering::Relaxed);
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.push_back((now, generated));
        while recent
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW)
        {
            recent.pop_front();
        }
    }

    /// One slot's draft-and-verify step: `drafted` drafts, `accepted` kept.
    pub fn speculated(&self, drafted: usize, accepted: usize) {
        self.c.mtp_steps.fetch_add(1, Ordering::Relaxed);
        self.c
            .mtp_drafted
            .fetch_add(drafted as u64, Ordering::Relaxed);
        self.c
            .mtp_accepted
            .fetch_add(accepted as u64, Ordering::Relaxed);
    }

    /// The expert cache's totals (read from the backend when a request ends).
    pub fn set_expert_cache(&self, counts: &[crate::backend::ExpertCacheCounts]) {
        let sum =
            |f: &dyn Fn(&crate::backend::ExpertCacheCounts) -> u64| counts.iter().map(f).sum();
        self.c.cache_hits.store(sum(&|c| c.hits), Ordering::Relaxed);
        self.c
            .cache_misses
            .store(sum(&|c| c.misses), Ordering::Relaxed);
        let bytes = sum(&|c| c.misses * c.bytes_per_miss);
        self.c.cache_bytes.store(bytes, Ordering::Relaxed);
        self.c
            .cache_wait_ns
            .store(sum(&|c| c.wait_ns), Ordering::Relaxed);
    }

    pub fn set_busy(&self, busy: usize) {
        self.c.busy_slots.store(busy as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self, queue_depth: usize) -> MetricsSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let uptime = self.started.elapsed().as_secs_f64();
        let window = RATE_WINDOW.as_secs_f64().min(uptime).max(1e-3);
        let now = Instant::now();
        let generated: u64 = self
            .recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= RATE_WINDOW)
            .map(|(_, n)| n)
            .sum();
        MetricsSnapshot {
            slots: self.slots,
            busy_slots: get(&self.c.busy_slots),
            queue_depth,
            max_queue_depth: get(&self.c.max_queue),
            requests_submitted: get(&self.c.submitted),
            requests_rejected: get(&self.c.rejected),
            requests_finished: get(&self.c.finished),
            requests_cancelled: get(&self.c.cancelled),
            requests_failed: get(&self.c.failed),
            prompt_tokens: get(&self.c.prompt_tokens),
            cached_prompt_tokens: get(&self.c.cached_tokens),
            prefill_tokens: get(&self.c.prefill_tokens),
            completion_tokens: get(&self.c.completion_tokens),
            prefix_lookups: get(&self.c.prefix_lookups),
            prefix_hits: get(&self.c.prefix_hits),
            steps: get(&self.c.steps),
            step_rows: get(&self.c.step_rows),
            step_sequences: get(&self.c.step_sequences),
            tokens_per_second: generated as f64 / window,
            uptime_seconds: uptime,
            mtp_steps: get(&self.c.mtp_steps),
            mtp_drafted: get(&self.c.mtp_drafted),
            mtp_accepted: get(&self.c.mtp_accepted),
            expert_cache_hits: get(&self.c.cache_hits),
            expert_cache_misses: get(&self.c.cache_misses),
            expert_cache_bytes: get(&self.c.cache_bytes),
            expert_cache_wait_ns: get(&self.c.cache_wait_ns),
        }
    }
}
