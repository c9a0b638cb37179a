//! One slot: a sequence state, its prompt-reuse cache, and the job it runs. A job first
//! ingests the prompt tokens its resume point did not cover, then samples a token per step
//! and feeds it back, until a stop.

use std::time::Instant;

use crate::backend::SeqState;
use crate::generate::StopReason;
use crate::sampling::{greedy_argmax, Sampler, StopMatcher};
use crate::serve::prefix::PrefixCache;
use crate::serve::{Event, Finish, Job, TokenLogprobs};
use crate::speculative::judge;
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// A job in a slot.
pub struct Active<'t> {
    pub job: Job,
    /// Index of the next prompt token to ingest (`job.prompt.len()` once the prompt is in).
    pub next_prompt: usize,
    pub cached: usize,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    generated: usize,
    /// The last sampled token, fed at the next step.
    pub pending: Option<u32>,
    /// Logits already known for the whole prompt (resumed from a snapshot that kept them).
    pub ready: Option<Vec<f32>>,
    /// MTP drafts that follow `pending`, verified at the next step, and the distribution
    /// each was drawn from.
    pub drafts: Vec<u32>,
    draft_dists: Vec<Vec<(u32, f64)>>,
    /// Drafts of a sampler that is not greedy are the block's largest logits
    /// (`REDLITE_MTP_ARGMAX_DRAFTS=1`, speculative.rs), not drawn from the sampler.
    argmax_drafts: bool,
    /// `[pending, drafts...]`: the rows of the next step when drafts exist.
    pub verify: Vec<u32>,
    queued_at: Instant,
    admitted_at: Instant,
    first_token_at: Option<Instant>,
    /// Admission order, for fair prefill.
    pub ticket: u64,
}

/// What the slot does in the next step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    Idle,
    /// Ingest prompt tokens `from..to`; logits when `to` ends the prompt.
    Prefill {
        from: usize,
        to: usize,
    },
    /// Feed the last sampled token.
    Decode(u32),
    /// Sample from logits the slot already has (no rows in the forward call).
    Ready,
}

/// A slot's outcome after a step's logits.
pub enum Outcome {
    Continue,
    Done(StopReason),
}

/// What verifying a slot's drafts gave.
pub struct Verified {
    pub drafts: Vec<u32>,
    /// Drafts the rule kept.
    pub accepted: usize,
    /// Drafts that stay fed: `accepted`, or one fewer when emitting the last kept draft
    /// ended the job (a job's last token is never fed).
    pub fed: usize,
    pub outcome: Outcome,
}

impl<'t> Active<'t> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        job: Job,
        tokenizer: &'t Tokenizer,
        sampler: Sampler,
        cached: usize,
        queued_at: Instant,
        ticket: u64,
    ) -> Active<'t> {
        let mut sampler = sampler;
        for &t in &job.prompt {
            sampler.accept(t);
        }
        let decoder = tokenizer.stream_decoder(job.render_special);
        let stops = StopMatcher::new(job.stop.iter().cloned());
        Active {
            next_prompt: cached,
            cached,
            sampler,
            decoder,
            stops,
            generated: 0,
            pending: None,
            ready: None,
            drafts: Vec::new(),
            draft_dists: Vec::new(),
            argmax_drafts: crate::speculative::argmax_drafts(),
            verify: Vec::new(),
            queued_at,
            admitted_at: Instant::now(),
            first_token_at: None,
            ticket,
            job,
        }
    }

    pub fn work(&self, chunk: usize) -> Work {
        if self.ready.is_some() {
            return Work::Ready;
        }
        if let Some(t) = self.pending {
            return Work::Decode(t);
        }
        let n = self.job.prompt.len();
        if self.next_prompt < n {
            return Work::Prefill {
                from: self.next_prompt,
                to: (self.next_prompt + chunk).min(n),
            };
        }
        Work::Idle
    }

    /// Samples from the logits that followed the last ingested token, streams the token, and
    /// says whether the job goes on. `false` from the sink cancels.
    pub fn take_logits(
        &mut self,
        logits: &[f32],
        tokenizer: &Tokenizer,
    ) -> Result<Outcome, String> {
        self.first_token_at.get_or_insert_with(Instant::now);
        let token = self.sampler.sample(logits).map_err(|e| e.to_string())?;
        self.emit(token, logits, tokenizer)
    }

    /// Tokens the job may still generate after `pending` (drafts beyond it are wasted).
    pub fn budget(&self) -> usize {
        self.job.max_tokens.saturating_sub(self.generated)
    }

    /// Draws an MTP draft from its logits with the job's sampling settings (or takes their
    /// largest, with argmax drafts), and keeps its distribution for the acceptance rule.
    pub fn pick_draft(&mut self, logits: &[f32]) -> Result<u32, String> {
        let (d, dist) = if self.argmax_drafts {
            // A one-hot draft distribution: the rule keeps `d` with probability p(d).
            let d = greedy_argmax(logits).map_err(|e| e.to_string())?;
            (d, vec![(d, 1.0)])
        } else {
            let dist = self
                .sampler
                .distribution(logits)
                .map_err(|e| e.to_string())?;
            (self.sampler.draw_from(&dist), dist)
        };
        self.draft_dists.push(dist);
        self.drafts.push(d);
        Ok(d)
    }

    /// Sets the next step's verification rows from `pending` and the drafts.
    pub fn seal_drafts(&mut self) {
        self.verify.clear();
        if let (Some(t), false) = (self.pending, self.drafts.is_empty()) {
            self.verify.push(t);
            self.verify.extend_from_slice(&self.drafts);
        }
    }

    /// Verifies the drafts against the trunk's rows (`rows`: `[drafts + 1][vocab]`) with the
    /// speculative acceptance rule, emitting each kept draft and then the trunk's own token
    /// as `take_logits` does. Returns the drafts, how many were kept, how many of those must
    /// stay fed (fewer when an emitted draft ended the job), and the outcome.
    pub fn take_verified(
        &mut self,
        rows: &[f32],
        vocab: usize,
        tokenizer: &Tokenizer,
    ) -> Result<Verified, String> {
        let drafts = std::mem::take(&mut self.drafts);
        let dists = std::mem::take(&mut self.draft_dists);
        self.verify.clear();
        let row = |i: usize| rows.get(i * vocab..(i + 1) * vocab).ok_or("missing logits");
        for (i, (&d, q)) in drafts.iter().zip(&dists).enumerate() {
            let logits = row(i)?;
            let p = self
                .sampler
                .distribution(logits)
                .map_err(|e| e.to_string())?;
            let outcome = match judge(&mut self.sampler, &p, q, d) {
                None => self.emit(d, logits, tokenizer)?,
                Some(c) => {
                    let outcome = self.emit(c, logits, tokenizer)?;
                    return Ok(Verified {
                        drafts,
                        accepted: i,
                        fed: i,
                        outcome,
                    });
                }
            };
            if let Outcome::Done(_) = outcome {
                return Ok(Verified {
                    drafts,
                    accepted: i + 1,
                    fed: i,
                    outcome,
                });
            }
        }
        let n = drafts.len();
        let logits = row(n)?;
        let bonus = self.sampler.sample(logits).map_err(|e| e.to_string())?;
        let outcome = self.emit(bonus, logits, tokenizer)?;
        Ok(Verified {
            drafts,
            accepted: n,
            fed: n,
            outcome,
        })
    }

    /// Streams a sampled `token` (its `logits` give the log-probabilities) and says whether
    /// the job goes on; the token becomes `pending`.
    fn emit(
        &mut self,
        token: u32,
        logits: &[f32],
        tokenizer: &Tokenizer,
    ) -> Result<Outcome, String> {
        self.pending = None;
        if tokenizer.is_eog(token) {
            return Ok(Outcome::Done(StopReason::EndOfGeneration));
        }
        self.sampler.accept(token);
        self.generated += 1;
        let piece = self.decoder.push(token).map_err(|e| e.to_string())?;
        let out = self.stops.push(&piece);
        let logprobs = self.job.logprobs.map(|top| logprobs(logits, token, top));
        let delivered = self.job.sink.send(Event::Token {
            id: token,
            text: out.text,
            logprobs,
        });
        if !delivered {
            return Ok(Outcome::Done(StopReason::Cancelled));
        }
        if let Some(s) = out.stopped_by {
            return Ok(Outcome::Done(StopReason::StopString(s)));
        }
        if self.generated >= self.job.max_tokens {
            return Ok(Outcome::Done(StopReason::Length));
        }
        self.pending = Some(token);
        Ok(Outcome::Continue)
    }

    /// Flushes held-back text and reports the end.
    pub fn finish(mut self, reason: StopReason) {
        if !matches!(reason, StopReason::StopString(_) | StopReason::Cancelled) {
            let tail = self.decoder.finish();
            let out = self.stops.push(&tail);
            let rest = out.text + &self.stops.finish();
            if !rest.is_empty() {
                self.job.sink.send(Event::Text(rest));
            }
        }
        let now = Instant::now();
        let first = self.first_token_at.unwrap_or(now);
        let finish = Finish {
            reason,
            prompt_tokens: self.job.prompt.len(),
            cached_tokens: self.cached,
            completion_tokens: self.generated,
            queue_seconds: self
                .admitted_at
                .duration_since(self.queued_at)
                .as_secs_f64(),
            prefill_seconds: first.duration_since(self.admitted_at).as_secs_f64(),
            decode_seconds: now.duration_since(first).as_secs_f64(),
        };
        self.job.sink.send(Event::Done(finish));
    }
}

/// Natural-log probabilities of `token` and of the `top` most likely tokens, from raw logits.
fn logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let max = logits
        .iter()
        .copied()
        .filter(|l| l.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| f64::from(l - max).exp())
        .sum();
    let log_z = f64::from(max) + sum.ln();
    let lp = |l: f32| (f64::from(l) - log_z) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (id, &l) in logits.iter().enumerate() {
            if !l.is_finite() {
                continue;
            }
            if best.len() < top || l > best[best.len() - 1].1 {
                let at = best.partition_point(|&(_, b)| b >= l);
                best.insert(at, (id as u32, l));
                best.truncate(top);
            }
        }
    }
    TokenLogprobs {
        logprob: lp(logits
            .get(token as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY)),
        top: best.into_iter().map(|(id, l)| (id, lp(l))).collect(),
    }
}

/// A sequence state with its reuse cache and, when busy, its job.
pub struct Slot<'t, S: SeqState> {
    pub state: S,
    /// The MTP block's state of this slot (`serve --mtp`).
    pub mtp: Option<S>,
    /// This step's verification records the DeltaNet state per row (a rejected draft rolls
    /// back to the last kept row).
    pub checkpointed: bool,
    pub cache: PrefixCache<S::Snapshot>,
    pub active: Option<Active<'t>>,
    /// When the slot last finished a job (for least-recently-used choice).
    pub last_used: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_log_softmax_and_top_is_sorted() {
        let logits = [1.0f32, 3.0, 2.0, f32::NEG_INFINITY];
        let lp = logprobs(&logits, 2, 2);
        let z: f64 = logits[..3].iter().map(|&l| f64::from(l).exp()).sum();
        assert!((f64::from(lp.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(lp.top.len(), 2);
        assert_eq!(lp.top[0].0, 1);
        assert_eq!(lp.top[1].0, 2);
        assert!((f64::from(lp.top[0].1) - (3.0 - z.ln())).abs() < 1e-6);
    }
}
