//! `redlite bench`: llama-bench's measurements on one session. Prompt processing (`pp`):
//! `n_prompt` tokens in one prefill from an empty state. Token generation (`tg`): `n_gen`
//! tokens decoded one at a time after a context of `depth` tokens (not timed). One warm-up
//! run of each test is excluded (two for speculative decoding: [`MTP_WARMUP_RUNS`]);
//! repetitions give a mean and a standard deviation. Each repetition feeds other tokens, so a
//! GPU expert cache is not measured on a replay.

use std::time::Instant;

use serde::Serialize;

use crate::backend::ExpertCacheCounts;
use crate::error::Result;
use crate::generate::StopReason;
use crate::sampling::{Sampler, SamplingParams};
use crate::session::{MtpTimings, Runner};
use crate::speculative::{MtpStats, Speculator, Step};

/// One test, as llama-bench names it (`pp512`, `tg128 @ d4096`).
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub test: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub depth: usize,
    pub repetitions: usize,
    /// Tokens per second of each repetition.
    pub samples_ts: Vec<f64>,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    /// Speculative decoding: drafts per step, the forced acceptance rate if any, and the
    /// counts over the timed repetitions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<BenchMtp>,
    /// With a GPU expert cache: its traffic over the timed repetitions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expert_cache: Option<BenchCache>,
}

/// The expert cache's traffic over a test's timed repetitions.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BenchCache {
    /// Of the chosen experts (distinct per MoE call), the share found on the GPU.
    pub hit_rate: f64,
    /// Experts copied in, and the bytes copied (misses and prefetches), per token.
    pub misses_per_token: f64,
    pub bytes_per_token: f64,
    /// Milliseconds per token the products of missing experts waited for their copies
    /// (one-token steps: the copies that computing the cached experts did not hide).
    pub wait_ms_per_token: f64,
    /// Hit rate of each cached block.
    pub layer_hit_rates: Vec<f64>,
    /// Microseconds per token of that wait in each cached block.
    pub layer_wait_us_per_token: Vec<f64>,
    /// With the prefetch: experts it brought in per token, and the share of them that a
    /// lookup then used.
    pub prefetched_per_token: f64,
    pub prefetch_used: f64,
}

/// Sums the cache's counters over timed stretches: `start` before, `stop` after each.
#[derive(Default)]
struct CacheTally {
    before: Vec<ExpertCacheCounts>,
    hits: Vec<u64>,
    misses: Vec<u64>,
    wait_ns: Vec<u64>,
    prefetched: u64,
    prefetch_hits: u64,
    bytes: u64,
}

impl CacheTally {
    fn start(&mut self, session: &dyn Runner) -> Result<()> {
        self.before = session.expert_cache_counts()?;
        Ok(())
    }

    fn stop(&mut self, session: &dyn Runner) -> Result<()> {
        self.add(session.expert_cache_counts()?);
        Ok(())
    }

    /// Adds what the counters `after` show since `before`.
    fn add(&mut self, after: Vec<ExpertCacheCounts>) {
        self.hits.resize(after.len(), 0);
        self.misses.resize(after.len(), 0);
        self.wait_ns.resize(after.len(), 0);
        for (i, (a, b)) in after.iter().zip(&self.before).enumerate() {
            self.hits[i] += a.hits - b.hits;
            self.misses[i] += a.misses - b.misses;
            self.wait_ns[i] += a.wait_ns - b.wait_ns;
            self.prefetched += a.prefetched - b.prefetched;
            self.prefetch_hits += a.prefetch_hits - b.prefetch_hits;
            self.bytes += (a.prefetched - b.prefetched) * a.bytes_per_miss;
            self.bytes += (a.misses - b.misses) * a.bytes_per_miss;
        }
    }

    /// The summary over `tokens` timed tokens; `None` without a cache.
    fn summary(&self, tokens: usize) -> Option<BenchCache> {
        if self.hits.is_empty() {
            return None;
        }
        let rate = |h: u64, m: u64| h as f64 / (h + m).max(1) as f64;
        let (hits, misses) = (self.hits.iter().sum(), self.misses.iter().sum::<u64>());
        let tokens = tokens.max(1) as f64;
        Some(BenchCache {
            hit_rate: rate(hits, misses),
            misses_per_token: misses as f64 / tokens,
            bytes_per_token: self.bytes as f64 / tokens,
            wait_ms_per_token: self.wait_ns.iter().sum::<u64>() as f64 * 1e-6 / tokens,
            layer_hit_rates: self
                .hits
                .iter()
                .zip(&self.misses)
                .map(|(&h, &m)| rate(h, m))
                .collect(),
            layer_wait_us_per_token: self
                .wait_ns
                .iter()
                .map(|&w| w as f64 * 1e-3 / tokens)
                .collect(),
            prefetched_per_token: self.prefetched as f64 / tokens,
            prefetch_used: self.prefetch_hits as f64 / self.prefetched.max(1) as f64,
        })
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchMtp {
    pub draft: usize,
    pub force_accept: Option<f64>,
    pub stats: MtpStats,
    pub acceptance_rate: f64,
    pub mean_accepted: f64,
    /// Per verification step, milliseconds: drafting, verifying, rolling back.
    pub draft_ms: f64,
    pub verify_ms: f64,
    /// Of `verify_ms`, arming the recording of the DeltaNet row states.
    pub checkpoint_ms: f64,
    pub rollback_ms: f64,
}

/// Token ids for benchmarking: spread over the vocabulary, deterministic.
fn bench_tokens(n: usize, n_vocab: usize, salt: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % n_vocab.min(150_000)) as u32)
        .collect()
}

fn summarize(
    test: String,
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    samples: Vec<f64>,
) -> BenchResult {
    let n = samples.len() as f64;
    let avg = samples.iter().sum::<f64>() / n;
    let var = if samples.len() > 1 {
        samples.iter().map(|s| (s - avg).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    BenchResult {
        test,
        n_prompt,
        n_gen,
        depth,
        repetitions: samples.len(),
        samples_ts: samples,
        avg_ts: avg,
        stddev_ts: var.sqrt(),
        mtp: None,
        expert_cache: None,
    }
}

/// Prompt processing of `n_prompt` tokens.
pub fn bench_prompt(session: &mut dyn Runner, n_prompt: usize, reps: usize) -> Result<BenchResult> {
    let mut samples = Vec::with_capacity(reps);
    let mut cache = CacheTally::default();
    for rep in 0..=reps {
        // Other tokens each repetition: an expert cache must not find the last one's experts.
        let tokens = bench_tokens(n_prompt, session.n_vocab(), 1 + 10 * rep);
        session.reset();
        cache.start(session)?;
        let start = Instant::now();
        session.feed(&tokens, false, false)?;
        let seconds = start.elapsed().as_secs_f64();
        if rep > 0 {
            samples.push(n_prompt as f64 / seconds);
            cache.stop(session)?;
        }
    }
    let mut result = summarize(format!("pp{n_prompt}"), n_prompt, 0, 0, samples);
    result.expert_cache = cache.summary(n_prompt * reps);
    Ok(result)
}

/// Generation of `n_gen` tokens after `depth` tokens of context: llama-bench's fixed tokens,
/// or with `sampling` each next token drawn from the last one's logits as `generate` and
/// `chat` draw it (the logits read on the host every token; the test named `… t<temp>`).
pub fn bench_gen(
    session: &mut dyn Runner,
    n_gen: usize,
    depth: usize,
    reps: usize,
    sampling: Option<&SamplingParams>,
) -> Result<BenchResult> {
    let mut samples = Vec::with_capacity(reps);
    let mut cache = CacheTally::default();
    for rep in 0..=reps {
        let context = bench_tokens(depth, session.n_vocab(), 2 + 10 * rep);
        let gen = bench_tokens(n_gen, session.n_vocab(), 3 + 10 * rep);
        session.reset();
        if depth > 0 {
            session.feed(&context, false, false)?;
        }
        let mut sampler = sampling.cloned().map(Sampler::new).transpose()?;
        cache.start(session)?;
        let start = Instant::now();
        match sampler.as_mut() {
            None => {
                for &t in &gen {
                    session.step(t)?;
                }
            }
            Some(sampler) => {
                let mut token = gen.first().copied().unwrap_or(0);
                for _ in 0..n_gen {
                    token = sampler.sample(session.step(token)?)?;
                    sampler.accept(token);
                }
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        if rep > 0 {
            samples.push(n_gen as f64 / seconds);
            cache.stop(session)?;
        }
        debug_assert_eq!(session.pos(), depth + n_gen);
    }
    let name = if depth > 0 {
        format!("tg{n_gen} @ d{depth}")
    } else {
        format!("tg{n_gen}")
    };
    let name = name + &sampled_suffix(sampling);
    let mut result = summarize(name, 0, n_gen, depth, samples);
    result.expert_cache = cache.summary(n_gen * reps);
    Ok(result)
}

/// Warm-up runs of a speculative test. A chained step runs as before the first time its shape
/// (rows of each forward call: the block's catch-up after k kept drafts, fewer drafts near
/// the end) is seen and is recorded as one CUDA graph the second time, with the GPU idle while
/// the host records (`backend/cuda/step_graph.rs`); the forced verdicts repeat from run to
/// run, so after two runs every shape of a run replays, as over a long generation, the state
/// the plain `tg` test measures after its one warm-up (its decode graph recorded).
pub const MTP_WARMUP_RUNS: usize = 2;

/// Generation of `n_gen` tokens with speculative decoding (greedy, or drawn with `sampling`
/// through the acceptance rule; `draft` drafts per step, optionally a forced acceptance rate)
/// after `depth` tokens of context (at least one: the first token is sampled from the
/// context's logits). Tokens are the model's own.
pub fn bench_gen_mtp(
    session: &mut dyn Runner,
    n_gen: usize,
    (depth, reps): (usize, usize),
    (draft, force_accept): (usize, Option<f64>),
    sampling: Option<&SamplingParams>,
) -> Result<BenchResult> {
    let context = bench_tokens(depth.max(1), session.n_vocab(), 2);
    let mut samples = Vec::with_capacity(reps);
    let mut total = MtpStats::default();
    let mut timings = MtpTimings::default();
    let mut force = None;
    for rep in 0..reps + MTP_WARMUP_RUNS {
        session.reset();
        let logits = session.feed(&context, false, false)?.logits;
        let mut sampler = Sampler::new(sampling.cloned().unwrap_or_else(SamplingParams::greedy))?;
        let mut spec = Speculator::new(draft, force_accept)?;
        force = spec.force_accept;
        session.take_mtp_timings();
        let start = Instant::now();
        let mut token = sampler.sample(&logits)?;
        let mut generated = 1;
        while generated < n_gen {
            let room = session.capacity().saturating_sub(session.pos() + 1);
            let n = draft.min(n_gen - generated - 1).min(room);
            if n == 0 {
                let logits = session.step(token)?;
                token = sampler.sample(logits)?;
                generated += 1;
                continue;
            }
            let mut count = |_: u32| -> Result<Option<StopReason>> {
                generated += 1;
                Ok((generated >= n_gen).then_some(StopReason::Length))
            };
            match spec.step(session, &mut sampler, token, n, &mut count)? {
                Step::Next(next) => {
                    token = next;
                    generated += 1;
                }
                Step::Stop(_) => break,
            }
        }
        let seconds = start.elapsed().as_secs_f64();
        if rep >= MTP_WARMUP_RUNS {
            // The first token came from the context's logits: count the decoded ones, as
            // the plain test does.
            samples.push(generated.saturating_sub(1) as f64 / seconds);
            total.add(&spec.stats);
            let t = session.take_mtp_timings();
            timings.steps += t.steps;
            timings.draft_seconds += t.draft_seconds;
            timings.verify_seconds += t.verify_seconds;
            timings.accept_seconds += t.accept_seconds;
            timings.checkpoint_seconds += t.checkpoint_seconds;
        }
    }
    let name = match (depth, force) {
        (0, None) => format!("tg{n_gen} mtp{draft}"),
        (0, Some(r)) => format!("tg{n_gen} mtp{draft} a{r}"),
        (d, None) => format!("tg{n_gen} mtp{draft} @ d{d}"),
        (d, Some(r)) => format!("tg{n_gen} mtp{draft} a{r} @ d{d}"),
    } + &sampled_suffix(sampling);
    let per_step = |seconds: f64| 1e3 * seconds / timings.steps.max(1) as f64;
    let mut result = summarize(name, 0, n_gen, depth, samples);
    result.mtp = Some(BenchMtp {
        draft,
        force_accept: force,
        stats: total,
        acceptance_rate: total.acceptance_rate(),
        mean_accepted: total.mean_accepted(),
        draft_ms: per_step(timings.draft_seconds),
        verify_ms: per_step(timings.verify_seconds),
        checkpoint_ms: per_step(timings.checkpoint_seconds),
        rollback_ms: per_step(timings.accept_seconds),
    });
    Ok(result)
}

/// The test name's mark of sampled tokens: ` t<temperature>`, none for llama-bench's.
fn sampled_suffix(sampling: Option<&SamplingParams>) -> String {
    sampling.map_or(String::new(), |p| format!(" t{}", p.temperature))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(hits: u64, misses: u64, wait_ns: u64, prefetched: (u64, u64)) -> ExpertCacheCounts {
        ExpertCacheCounts {
            layer: 0,
            hits,
            misses,
            lookups: 0,
            bytes_per_miss: 1000,
            wait_ns,
            prefetched: prefetched.0,
            prefetch_hits: prefetched.1,
        }
    }

    #[test]
    fn the_cache_summary_counts_misses_prefetches_and_waits_per_token() {
        let mut tally = CacheTally {
            before: vec![counts(10, 5, 1_000_000, (4, 1))],
            ..CacheTally::default()
        };
        // Over 10 tokens: 30 hits, 10 misses, 2 ms waited, 8 prefetched of which 6 used.
        tally.add(vec![counts(40, 15, 3_000_000, (12, 7))]);
        let s = tally.summary(10).expect("a cache");
        assert_eq!(s.hit_rate, 0.75);
        assert_eq!(s.misses_per_token, 1.0);
        // Misses and prefetches both cross PCIe: (10 + 8) x 1000 bytes over 10 tokens.
        assert_eq!(s.bytes_per_token, 1800.0);
        assert_eq!(s.wait_ms_per_token, 0.2);
        assert_eq!(s.layer_wait_us_per_token, vec![200.0]);
        assert_eq!(s.prefetched_per_token, 0.8);
        assert_eq!(s.prefetch_used, 0.75);
        assert!(CacheTally::default().summary(10).is_none());
    }
}
