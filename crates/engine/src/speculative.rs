//! Speculative decoding with the model's own MTP block: per step the block drafts up to
//! `draft` tokens (chained on its own output), the trunk verifies them in one batch, and
//! the longest acceptable prefix is kept.
//!
//! Acceptance is the standard rule (Leviathan et al. 2023; Chen et al. 2023): draft `d`,
//! drawn from the draft distribution `q`, is kept with probability `min(1, p(d) / q(d))`
//! where `p` is the trunk's distribution at that row (both after the sampler's penalties,
//! truncations and temperature); on rejection the token is drawn from `max(0, p - q)`
//! normalized, and when every draft is kept one more comes from the last row's `p`. The
//! output then has exactly the distribution of plain sampling. Greedy sampling makes `p`
//! and `q` one-hot, so the rule is "keep while the draft equals the trunk's argmax" and the
//! output is token for token the plain greedy output.
//!
//! With a sampler that is not greedy each draft is drawn from the sampler's distribution
//! over the block's logits, on the host, between the drafts. `REDLITE_MTP_ARGMAX_DRAFTS=1`
//! takes the block's largest logit instead: a draft that is a function of the context has a
//! one-hot `q`, so the rule keeps draft `d` with probability `p(d)` and otherwise draws from
//! `p` without `d`, which is drawing the row's token as plain sampling does and keeping the
//! draft where the two agree. Those drafts need no logits on the host (on the GPU the step's
//! drafts and verification run as one chained step, as greedy ones do, and only the
//! verification's rows come back), but they are kept less often where `p` is spread: the
//! demo model at the default sampling keeps 35-45 % of single argmax drafts against 60-64 % of
//! sampled ones (docs/MTP.md).
//!
//! `REDLITE_MTP_FORCE_ACCEPT=R` (benchmarks only) keeps each draft with probability `R`
//! whatever the trunk says, to time the speed-up as a function of the acceptance rate.

use serde::Serialize;

use crate::error::{EngineError, Result};
use crate::generate::StopReason;
use crate::sampling::{Rng, Sampler};
use crate::session::{GreedyStep, Runner, MAX_DRAFT};

/// Environment variable of the forced acceptance rate (benchmarks only).
pub const FORCE_ACCEPT_ENV: &str = "REDLITE_MTP_FORCE_ACCEPT";

/// Environment variable that makes a sampler's drafts the block's largest logits.
pub const ARGMAX_DRAFTS_ENV: &str = "REDLITE_MTP_ARGMAX_DRAFTS";

/// Whether drafts for a sampler that is not greedy are the block's largest logits
/// (`REDLITE_MTP_ARGMAX_DRAFTS=1`) rather than drawn from the sampler's distribution.
pub fn argmax_drafts() -> bool {
    std::env::var(ARGMAX_DRAFTS_ENV).is_ok_and(|v| v.trim() == "1")
}

/// Counts over a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct MtpStats {
    /// Draft-and-verify steps.
    pub steps: usize,
    /// Tokens the MTP block drafted.
    pub drafted: usize,
    /// Drafts the trunk kept.
    pub accepted: usize,
}

impl MtpStats {
    /// Kept drafts per step (each step also yields one token of the trunk's own).
    pub fn mean_accepted(&self) -> f64 {
        self.accepted as f64 / (self.steps.max(1)) as f64
    }

    /// Kept drafts over drafted ones.
    pub fn acceptance_rate(&self) -> f64 {
        self.accepted as f64 / (self.drafted.max(1)) as f64
    }

    pub fn add(&mut self, other: &MtpStats) {
        self.steps += other.steps;
        self.drafted += other.drafted;
        self.accepted += other.accepted;
    }
}

/// What a step ended with.
pub enum Step {
    /// The next token (a correction or the bonus token): sampled, not yet emitted or fed,
    /// like the result of a plain `sample`.
    Next(u32),
    /// Emitting a kept draft ended the generation.
    Stop(StopReason),
}

/// The drafting policy of one generation and its statistics.
pub struct Speculator {
    /// Drafts per step (1 to `MAX_DRAFT`).
    pub draft: usize,
    /// Benchmark-only forced acceptance rate.
    pub force_accept: Option<f64>,
    force_rng: Rng,
    /// Drafts of a sampler that is not greedy are the block's largest logits, not drawn
    /// from the sampler's distribution.
    pub argmax_drafts: bool,
    pub stats: MtpStats,
}

impl Speculator {
    /// `draft` drafts per step; the forced acceptance rate comes from `force_accept`, or
    /// when that is `None` from `REDLITE_MTP_FORCE_ACCEPT`.
    pub fn new(draft: usize, force_accept: Option<f64>) -> Result<Speculator> {
        if draft == 0 || draft > MAX_DRAFT {
            return Err(EngineError::BadConfig(format!(
                "--draft must be 1 to {MAX_DRAFT}, got {draft}"
            )));
        }
        let force_accept = match force_accept {
            Some(r) => Some(r),
            None => match std::env::var(FORCE_ACCEPT_ENV) {
                Ok(v) => Some(v.trim().parse::<f64>().map_err(|_| {
                    EngineError::BadConfig(format!(
                        "{FORCE_ACCEPT_ENV}={v:?} is not a number in [0, 1]"
                    ))
                })?),
                Err(_) => None,
            },
        };
        if let Some(r) = force_accept {
            if !(0.0..=1.0).contains(&r) {
                return Err(EngineError::BadConfig(format!(
                    "forced acceptance rate {r} is outside [0, 1]"
                )));
            }
        }
        Ok(Speculator {
            draft,
            force_accept,
            force_rng: Rng::new(0x5eed_acce_97ed),
            argmax_drafts: argmax_drafts(),
            stats: MtpStats::default(),
        })
    }

    /// One step after `token` (already emitted and accepted by the sampler, not yet fed):
    /// drafts `n` tokens (1 to `draft`; the caller leaves room in the context and the
    /// token budget), verifies them, emits the kept ones through `on_token` (which returns
    /// a stop reason to end the generation; the sampler then `accept`s the token), and
    /// leaves the session exactly where plain decoding would be.
    pub fn step(
        &mut self,
        session: &mut dyn Runner,
        sampler: &mut Sampler,
        token: u32,
        n: usize,
        on_token: &mut dyn FnMut(u32) -> Result<Option<StopReason>>,
    ) -> Result<Step> {
        if sampler.always_greedy() {
            return self.greedy_step(session, sampler, token, n, on_token);
        }
        if self.argmax_drafts {
            return self.argmax_draft_step(session, sampler, token, n, on_token);
        }
        let mut q: Vec<Vec<(u32, f64)>> = Vec::with_capacity(n);
        let drafts = session.mtp_draft(token, n, &mut |logits| {
            let dist = sampler.distribution(logits)?;
            let d = sampler.draw_from(&dist);
            q.push(dist);
            Ok(d)
        })?;
        let mut batch = Vec::with_capacity(n + 1);
        batch.push(token);
        batch.extend_from_slice(&drafts);
        let logits = session.mtp_verify(&batch)?;
        let vocab = logits.len() / batch.len();
        let judge_row = |sampler: &mut Sampler, i: usize, row: &[f32], d: u32| {
            let q = q.get(i).ok_or_else(|| {
                EngineError::BadConfig(format!("draft {i} has no draft distribution"))
            })?;
            let p = sampler.distribution(row)?;
            Ok(judge(sampler, &p, q, d))
        };
        self.keep_prefix(
            session,
            sampler,
            (&drafts, &logits, vocab),
            on_token,
            judge_row,
        )
    }

    /// The verification of `drafts` against its rows (`logits`, `vocab` a row): each draft
    /// judged by `judge_row` (`None` keeps it, `Some(t)` replaces it by `t`; the forced rate
    /// instead where set) and emitted through `on_token` while kept, then the bonus token
    /// from the last row; the session keeps the prefix.
    fn keep_prefix(
        &mut self,
        session: &mut dyn Runner,
        sampler: &mut Sampler,
        (drafts, logits, vocab): (&[u32], &[f32], usize),
        on_token: &mut dyn FnMut(u32) -> Result<Option<StopReason>>,
        mut judge_row: impl FnMut(&mut Sampler, usize, &[f32], u32) -> Result<Option<u32>>,
    ) -> Result<Step> {
        let n = drafts.len();
        let row = |i: usize| &logits[i * vocab..(i + 1) * vocab];
        self.stats.steps += 1;
        self.stats.drafted += n;
        for (i, &d) in drafts.iter().enumerate() {
            let verdict = match self.force_accept {
                Some(rate) if self.force_rng.next_f64() < rate => None,
                // Forced rejection: the trunk's own token at this row.
                Some(_) => Some(sampler.sample(row(i))?),
                None => judge_row(sampler, i, row(i), d)?,
            };
            if let Some(replacement) = verdict {
                session.mtp_accept(i)?;
                self.stats.accepted += i;
                return Ok(Step::Next(replacement));
            }
            if let Some(reason) = on_token(d)? {
                session.mtp_accept(i)?;
                self.stats.accepted += i + 1;
                return Ok(Step::Stop(reason));
            }
            sampler.accept(d);
        }
        let bonus = sampler.sample(row(n))?;
        session.mtp_accept(n)?;
        self.stats.accepted += n;
        Ok(Step::Next(bonus))
    }
}

impl Speculator {
    /// [`Speculator::step`] for a sampler that always picks the largest logit: drafts and
    /// the trunk's picks travel as ids (the backend picks them where it can, so no row of
    /// logits comes to the host). The acceptance rule with one-hot `p` and `q`: a draft is
    /// kept while it is the trunk's pick, the first rejected one is replaced by that pick,
    /// and the bonus token is the last row's pick: the tokens of [`Speculator::step`].
    fn greedy_step(
        &mut self,
        session: &mut dyn Runner,
        sampler: &mut Sampler,
        token: u32,
        n: usize,
        on_token: &mut dyn FnMut(u32) -> Result<Option<StopReason>>,
    ) -> Result<Step> {
        let GreedyStep { drafts, picks } = session.mtp_greedy_step(token, n)?;
        if picks.len() != n + 1 || drafts.len() != n {
            return Err(EngineError::BadConfig(format!(
                "a greedy step of {n} drafts gave {} drafts and {} picks",
                drafts.len(),
                picks.len()
            )));
        }
        self.stats.steps += 1;
        self.stats.drafted += n;
        for (i, &d) in drafts.iter().enumerate() {
            let keep = match self.force_accept {
                Some(rate) => self.force_rng.next_f64() < rate,
                None => picks[i] == d,
            };
            if !keep {
                session.mtp_accept(i)?;
                self.stats.accepted += i;
                return Ok(Step::Next(picks[i]));
            }
            if let Some(reason) = on_token(d)? {
                session.mtp_accept(i)?;
                self.stats.accepted += i + 1;
                return Ok(Step::Stop(reason));
            }
            sampler.accept(d);
        }
        session.mtp_accept(n)?;
        self.stats.accepted += n;
        Ok(Step::Next(picks[n]))
    }
}

impl Speculator {
    /// [`Speculator::step`] with the block's largest logit as each draft (a one-hot `q`): a
    /// draft is kept where the token drawn from its row as plain sampling draws it equals
    /// the draft, and otherwise that token replaces it, which keeps `d` with probability
    /// `p(d)` and draws the replacement from `p` without `d`, the acceptance rule's two
    /// parts for a one-hot `q`.
    fn argmax_draft_step(
        &mut self,
        session: &mut dyn Runner,
        sampler: &mut Sampler,
        token: u32,
        n: usize,
        on_token: &mut dyn FnMut(u32) -> Result<Option<StopReason>>,
    ) -> Result<Step> {
        let (drafts, logits) = session.mtp_argmax_step(token, n)?;
        let vocab = logits.len() / (n + 1);
        if drafts.len() != n || vocab == 0 || logits.len() != (n + 1) * vocab {
            return Err(EngineError::BadConfig(format!(
                "a step of {n} argmax drafts gave {} drafts and {} logits",
                drafts.len(),
                logits.len()
            )));
        }
        let judge_row = |sampler: &mut Sampler, _: usize, row: &[f32], d: u32| {
            let t = sampler.sample(row)?;
            Ok((t != d).then_some(t))
        };
        self.keep_prefix(
            session,
            sampler,
            (&drafts, &logits, vocab),
            on_token,
            judge_row,
        )
    }
}

/// The acceptance rule for draft `d` drawn from `q` against the trunk's `p`: `None` keeps
/// it, `Some(t)` rejects it with the replacement `t` drawn from `max(0, p - q)`.
pub fn judge(sampler: &mut Sampler, p: &[(u32, f64)], q: &[(u32, f64)], d: u32) -> Option<u32> {
    let prob = |dist: &[(u32, f64)], t: u32| dist.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
    let (pd, qd) = (prob(p, d), prob(q, d));
    if pd >= qd || (pd > 0.0 && sampler.uniform() < pd / qd) {
        return None;
    }
    // q by token id in a dense table (ids are vocabulary indices): without top-k both
    // distributions span the whole vocabulary, where a hash map took ~5 ms a rejection.
    let mut q_of = vec![0.0f64; q.iter().map(|e| e.0 as usize + 1).max().unwrap_or(0)];
    for &(t, qt) in q {
        q_of[t as usize] = qt;
    }
    let residual: Vec<(u32, f64)> = p
        .iter()
        .map(|&(t, pt)| {
            (
                t,
                (pt - q_of.get(t as usize).copied().unwrap_or(0.0)).max(0.0),
            )
        })
        .filter(|e| e.1 > 0.0)
        .collect();
    if residual.is_empty() {
        // Only possible through rounding (p and q equal): fall back to p itself.
        return Some(sampler.draw_from(p));
    }
    Some(sampler.draw_from(&residual))
}
