//! The scheduler loop: admit queued jobs into free slots (resuming from the best snapshot),
//! then run one forward call holding every decoding slot's next token and up to `chunk`
//! prompt tokens of the oldest prefilling slots, sample, stream, repeat.

use crate::backend::{Backend, SeqState};
use crate::error::Result;
use crate::generate::StopReason;
use crate::model::forward::{forward_batch, Logits, SeqInput, Workspace};
use crate::sampling::Sampler;
use crate::serve::prefix::{PrefixCache, Resume};
use crate::serve::slot::{Active, Outcome, Slot, Work};
use crate::serve::{Event, Pending, ServeConfig, Shared};
use crate::tokenizer::Tokenizer;

pub struct Scheduler<'a, B: Backend> {
    pub(super) backend: &'a B,
    pub(super) tokenizer: &'a Tokenizer,
    pub(super) config: &'a ServeConfig,
    pub(super) shared: &'a Shared,
    pub(super) slots: Vec<Slot<'a, B::State>>,
    pub(super) work: Workspace<B>,
    /// With `config.draft > 0`: the MTP block's workspace.
    pub(super) mtp_work: Option<Workspace<B>>,
    /// Increases with every admission and finish (ordering for fairness and eviction).
    tick: u64,
}

impl<'a, B: Backend> Scheduler<'a, B> {
    pub fn new(
        backend: &'a B,
        tokenizer: &'a Tokenizer,
        config: &'a ServeConfig,
        shared: &'a Shared,
    ) -> Result<Scheduler<'a, B>> {
        let mtp = config.draft > 0;
        let mut slots = Vec::with_capacity(config.slots);
        for _ in 0..config.slots {
            slots.push(Slot {
                state: backend.new_state(config.context, config.kv_type),
                mtp: if mtp {
                    Some(backend.new_mtp_state(config.context, config.kv_type)?)
                } else {
                    None
                },
                checkpointed: false,
                cache: PrefixCache::new(config.snapshots_per_slot),
                active: None,
                last_used: 0,
            });
        }
        // A decoding slot runs its token and its drafts.
        let mut work = Workspace::new(backend, config.slots * (1 + config.draft) + config.chunk);
        work.keep_normed = mtp;
        let mtp_work = mtp.then(|| Workspace::new(backend, config.chunk.max(config.draft + 1)));
        Ok(Scheduler {
            backend,
            tokenizer,
            config,
            shared,
            slots,
            work,
            mtp_work,
            tick: 0,
        })
    }

    fn busy(&self) -> usize {
        self.slots.iter().filter(|s| s.active.is_some()).count()
    }

    /// Serves until `Handle::shutdown`.
    pub fn run(&mut self) {
        loop {
            self.cancel_closed();
            if !self.admit() {
                self.stop_all();
                return;
            }
            if self.busy() == 0 {
                self.wait_for_work();
                continue;
            }
            self.step();
        }
    }

    /// Sleeps until a job arrives or the scheduler is stopped.
    fn wait_for_work(&self) {
        self.shared.metrics.set_busy(0);
        let mut queue = self.shared.queue();
        while queue.jobs.is_empty() && !queue.stopped {
            queue = self
                .shared
                .wake
                .wait(queue)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Frees the slots, and drops the queued jobs, whose client went away.
    fn cancel_closed(&mut self) {
        let gone = {
            let mut queue = self.shared.queue();
            let before = queue.jobs.len();
            queue.jobs.retain(|p| !p.job.sink.is_closed());
            before - queue.jobs.len()
        };
        for _ in 0..gone {
            self.shared.metrics.ended(&StopReason::Cancelled);
        }
        for slot in &mut self.slots {
            if slot.active.as_ref().is_some_and(|a| a.job.sink.is_closed()) {
                if let Some(active) = slot.active.take() {
                    self.shared.metrics.ended(&StopReason::Cancelled);
                    active.finish(StopReason::Cancelled);
                }
            }
        }
    }

    /// Moves queued jobs into free slots; `false` once the scheduler is stopped.
    fn admit(&mut self) -> bool {
        loop {
            if self.slots.iter().all(|s| s.active.is_some()) {
                return !self.shared.queue().stopped;
            }
            let pending = {
                let mut queue = self.shared.queue();
                if queue.stopped {
                    return false;
                }
                match queue.jobs.pop_front() {
                    Some(p) => p,
                    None => return true,
                }
            };
            if pending.job.sink.is_closed() {
                self.shared.metrics.ended(&StopReason::Cancelled);
                continue;
            }
            self.start(pending);
        }
    }

    /// Puts a job into the free slot that reuses most of its prompt (then the one idle
    /// longest), restoring the snapshot it resumes from.
    fn start(&mut self, pending: Pending) {
        let prompt = &pending.job.prompt;
        let Some((index, resume)) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.active.is_none())
            .map(|(i, s)| (i, s.cache.best(prompt)))
            .max_by_key(|&(i, r)| (r.reused(), std::cmp::Reverse(self.slots[i].last_used)))
        else {
            return;
        };
        self.tick += 1;
        let slot = &mut self.slots[index];
        let mut ready = None;
        let restored = match resume {
            Resume::Empty => {
                slot.state.reset_state();
                slot.cache.truncate(0);
                Ok(())
            }
            Resume::Live { .. } => Ok(()),
            Resume::Snapshot { index: at, pos } => {
                match slot.cache.take_for_restore(at, self.tick) {
                    Some((snapshot, logits)) => {
                        if pos == prompt.len() {
                            ready = logits.map(<[f32]>::to_vec);
                        }
                        slot.state.restore(snapshot).map(|()| {
                            slot.cache.truncate(pos);
                        })
                    }
                    None => Ok(()),
                }
            }
        };
        let sampler = Sampler::new(pending.job.sampling.clone());
        let (sampler, cached) = match (restored, sampler) {
            (Ok(()), Ok(s)) => (s, resume.reused()),
            (restored, sampler) => {
                let why = match (restored, sampler) {
                    (Err(e), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => String::new(),
                };
                slot.state.reset_state();
                slot.cache.clear();
                self.shared.metrics.failed();
                pending.job.sink.send(Event::Failed(why));
                return;
            }
        };
        self.shared.metrics.admitted(prompt.len(), cached);
        let started = pending.job.sink.send(Event::Started {
            slot: index,
            prompt_tokens: pending.job.prompt.len(),
            cached_tokens: cached,
        });
        let active = Active::new(
            pending.job,
            self.tokenizer,
            sampler,
            cached,
            pending.since,
            self.tick,
        );
        if started {
            let mut active = active;
            active.ready = ready;
            slot.active = Some(active);
        } else {
            self.shared.metrics.ended(&StopReason::Cancelled);
            active.finish(StopReason::Cancelled);
        }
    }

    /// What each slot does in this step: every decode, and prompt chunks of the oldest
    /// prefilling slots while they fit in `chunk` tokens (a chunk is never cut shorter, so a
    /// prompt is always split at the same points).
    fn plan(&self) -> Vec<(usize, Work)> {
        let chunk = self.config.chunk;
        let mut plan: Vec<(usize, Work)> = Vec::new();
        let mut prefills: Vec<(u64, usize, Work)> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(active) = &slot.active {
                match active.work(chunk) {
                    Work::Idle => {}
                    w @ (Work::Decode(_) | Work::Ready) => plan.push((i, w)),
                    w @ Work::Prefill { .. } => prefills.push((active.ticket, i, w)),
                }
            }
        }
        prefills.sort_by_key(|p| p.0);
        let mut budget = chunk;
        for (_, i, w) in prefills {
            if let Work::Prefill { from, to } = w {
                if to - from <= budget {
                    budget -= to - from;
                    plan.push((i, w));
                }
            }
        }
        plan.sort_by_key(|p| p.0);
        plan
    }

    /// One forward call over the planned slots, then sampling.
    fn step(&mut self) {
        let plan = self.plan();
        if plan.is_empty() {
            return;
        }
        // A slot that verifies drafts records its DeltaNet state per row (for a rollback).
        for (index, _) in &plan {
            let slot = &mut self.slots[*index];
            let verifying = slot.active.as_ref().is_some_and(|a| !a.verify.is_empty());
            slot.checkpointed = false;
            if verifying {
                if let Err(e) = slot.state.checkpoint() {
                    self.fail(&plan, &e.to_string());
                    return;
                }
                slot.checkpointed = true;
            }
        }
        // Per sequence of the call: its first row and its rows of logits.
        let mut wants_logits: Vec<usize> = Vec::with_capacity(plan.len());
        let mut row0s: Vec<usize> = Vec::with_capacity(plan.len());
        let mut next_row = 0;
        let result = {
            let mut seqs = Vec::with_capacity(plan.len());
            let mut plan_iter = plan.iter().peekable();
            for (i, slot) in self.slots.iter_mut().enumerate() {
                let Some((_, work)) = plan_iter.next_if(|(j, _)| *j == i) else {
                    continue;
                };
                let Some(active) = &slot.active else { continue };
                let (tokens, logits) = match work {
                    Work::Decode(_) if !active.verify.is_empty() => {
                        (&active.verify[..], Logits::All)
                    }
                    Work::Decode(_) => match &active.pending {
                        Some(t) => (std::slice::from_ref(t), Logits::Last),
                        None => continue,
                    },
                    Work::Prefill { from, to } => {
                        let last = *to == active.job.prompt.len();
                        let want = if last { Logits::Last } else { Logits::None };
                        (&active.job.prompt[*from..*to], want)
                    }
                    Work::Idle | Work::Ready => continue,
                };
                wants_logits.push(match logits {
                    Logits::None => 0,
                    Logits::Last => 1,
                    Logits::All => tokens.len(),
                });
                row0s.push(next_row);
                next_row += tokens.len();
                seqs.push(SeqInput {
                    state: &mut slot.state,
                    tokens,
                    logits,
                });
            }
            if seqs.is_empty() {
                Ok(Default::default())
            } else {
                forward_batch(self.backend, &mut self.work, &mut seqs, false)
            }
        };
        let rows = next_row;
        let prefill: usize = plan
            .iter()
            .map(|(_, w)| match w {
                Work::Prefill { from, to } => to - from,
                _ => 0,
            })
            .sum();
        let sequences = plan.iter().filter(|(_, w)| *w != Work::Ready).count();
        let output = match result {
            Ok(o) => o,
            Err(e) => {
                self.fail(&plan, &e.to_string());
                return;
            }
        };
        let n_vocab = self.backend.config().n_vocab;
        let mut generated = 0u64;
        let mut wants = wants_logits.into_iter().zip(row0s);
        let mut logit_row = 0;
        for (index, work) in &plan {
            if *work == Work::Ready {
                let ready = self.slots[*index]
                    .active
                    .as_mut()
                    .and_then(|a| a.ready.take());
                generated += self.advance(*index, work, ready.as_deref(), None) as u64;
                continue;
            }
            let Some((count, row0)) = wants.next() else {
                continue;
            };
            let logits = (count > 0)
                .then(|| {
                    output
                        .logits
                        .get(logit_row * n_vocab..(logit_row + count) * n_vocab)
                })
                .flatten();
            logit_row += count;
            generated += self.advance(*index, work, logits, Some(row0)) as u64;
        }
        self.shared
            .metrics
            .step(rows, sequences, prefill, generated, self.busy());
    }

    /// Records what slot `index` ingested (its rows start at `row0` of the call) and, with
    /// logits, samples its next token; returns how many tokens were generated.
    fn advance(
        &mut self,
        index: usize,
        work: &Work,
        logits: Option<&[f32]>,
        row0: Option<usize>,
    ) -> usize {
        self.tick += 1;
        let tick = self.tick;
        if let (Work::Decode(_), Some(rows), Some(row0)) = (work, logits, row0) {
            let verifying = self.slots[index]
                .active
                .as_ref()
                .is_some_and(|a| !a.verify.is_empty());
            if verifying {
                return self.advance_verified(index, rows, row0, tick);
            }
        }
        let slot = &mut self.slots[index];
        let Some(active) = slot.active.as_mut() else {
            return 0;
        };
        // The tokens this call fed, and what follows each (the last one's successor is
        // sampled below, or is the next prompt token).
        let fed: Vec<u32> = match *work {
            Work::Decode(t) => vec![t],
            Work::Prefill { from, to } => active.job.prompt[from..to].to_vec(),
            Work::Idle | Work::Ready => Vec::new(),
        };
        let pos0 = slot.state.pos() - fed.len();
        match *work {
            Work::Decode(t) => {
                slot.cache.extend(&[t]);
                active.pending = None;
            }
            Work::Prefill { from, to } => {
                slot.cache.extend(&active.job.prompt[from..to]);
                active.next_prompt = to;
                if let (Some(&next), Some(row0)) = (active.job.prompt.get(to), row0) {
                    // A prompt chunk that is not the last: the MTP block takes its rows now.
                    let mut successors = fed[1..].to_vec();
                    successors.push(next);
                    if let Err(e) = self.mtp_catch_up(index, row0, pos0, &successors, false) {
                        self.fail_slot(index, &e.to_string());
                        return 0;
                    }
                    return 0;
                }
                if to == active.job.prompt.len() {
                    // The end of a prompt: a request that repeats it (a regenerated answer)
                    // resumes here, with these logits.
                    if let Ok(s) = slot.state.snapshot() {
                        slot.cache.insert(s, logits.map(<[f32]>::to_vec), tick);
                    }
                }
            }
            Work::Idle | Work::Ready => {}
        }
        let Some(logits) = logits else {
            return 0;
        };
        let outcome = active.take_logits(logits, self.tokenizer);
        let reason = match outcome {
            Ok(Outcome::Continue) => {
                if let (Some(row0), false) = (row0, fed.is_empty()) {
                    if let Err(e) = self.draft(index, row0, pos0, &fed) {
                        self.fail_slot(index, &e.to_string());
                    }
                }
                return 1;
            }
            Ok(Outcome::Done(reason)) => reason,
            Err(e) => {
                if let Some(active) = slot.active.take() {
                    active.job.sink.send(Event::Failed(e));
                }
                self.shared.metrics.failed();
                return 0;
            }
        };
        let generated = usize::from(!matches!(reason, StopReason::EndOfGeneration));
        self.end_turn(index, reason, tick);
        generated
    }

    /// A slot's job ended with `reason`: the state is snapshotted for the next turn, the
    /// job reports its end.
    pub(super) fn end_turn(&mut self, index: usize, reason: StopReason, tick: u64) {
        let slot = &mut self.slots[index];
        if reason != StopReason::Cancelled {
            // The end of a turn: the next turn of the conversation starts with these tokens.
            if let Ok(s) = slot.state.snapshot() {
                slot.cache.insert(s, None, tick);
            }
        }
        slot.last_used = tick;
        if let Some(active) = slot.active.take() {
            self.shared.metrics.ended(&reason);
            active.finish(reason);
        }
        // Read once per request, not per step: it waits for the device.
        if let Ok(counts) = self.backend.expert_cache_counts() {
            self.shared.metrics.set_expert_cache(&counts);
        }
    }

    /// A slot's job failed (an MTP step): it reports the error, the slot starts empty.
    pub(super) fn fail_slot(&mut self, index: usize, why: &str) {
        let slot = &mut self.slots[index];
        slot.state.reset_state();
        slot.cache.clear();
        if let Some(active) = slot.active.take() {
            active.job.sink.send(Event::Failed(why.to_string()));
            self.shared.metrics.failed();
        }
    }

    /// A failed forward call leaves the states of its slots unknown: their jobs fail and the
    /// slots start empty.
    fn fail(&mut self, plan: &[(usize, Work)], why: &str) {
        for (index, _) in plan {
            let slot = &mut self.slots[*index];
            slot.state.reset_state();
            slot.cache.clear();
            if let Some(active) = slot.active.take() {
                active.job.sink.send(Event::Failed(why.to_string()));
                self.shared.metrics.failed();
            }
        }
    }

    /// Shutdown: every running and queued job fails.
    fn stop_all(&mut self) {
        for slot in &mut self.slots {
            if let Some(active) = slot.active.take() {
                active
                    .job
                    .sink
                    .send(Event::Failed("the server is shutting down".into()));
            }
        }
        let jobs: Vec<Pending> = self.shared.queue().jobs.drain(..).collect();
        for p in jobs {
            p.job
                .sink
                .send(Event::Failed("the server is shutting down".into()));
        }
    }
}
