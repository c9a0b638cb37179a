//! The scheduler loop: admit queued jobs into free slots (resuming from the best snapshot),
//! then run one forward call holding every decoding slot's next token and up to `chunk`
//! prompt tokens of the oldest prefilling slots, sample, stream, repeat.

use crate::backend::{Backend, SeqState};
use crate::generate::StopReason;
use crate::model::forward::{forward_batch, Logits, SeqInput, Workspace};
use crate::sampling::Sampler;
use crate::serve::prefix::{PrefixCache, Resume};
use crate::serve::slot::{Active, Outcome, Slot, Work};
use crate::serve::{Event, Pending, ServeConfig, Shared};
use crate::tokenizer::Tokenizer;

pub struct Scheduler<'a, B: Backend> {
    backend: &'a B,
    tokenizer: &'a Tokenizer,
    config: &'a ServeConfig,
    shared: &'a Shared,
    slots: Vec<Slot<'a, B::State>>,
    work: Workspace<B>,
    /// Increases with every admission and finish (ordering for fairness and eviction).
    tick: u64,
}

impl<'a, B: Backend> Scheduler<'a, B> {
    pub fn new(
        backend: &'a B,
        tokenizer: &'a Tokenizer,
        config: &'a ServeConfig,
        shared: &'a Shared,
    ) -> Scheduler<'a, B> {
        let slots = (0..config.slots)
            .map(|_| Slot {
                state: backend.new_state(config.context, config.kv_type),
                cache: PrefixCache::new(config.snapshots_per_slot),
                active: None,
                last_used: 0,
            })
            .collect();
        let work = Workspace::new(backend, config.slots + config.chunk);
        Scheduler {
            backend,
            tokenizer,
            config,
            shared,
            slots,
            work,
            tick: 0,
        }
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
        let mut wants_logits = Vec::with_capacity(plan.len());
        let result = {
            let mut seqs = Vec::with_capacity(plan.len());
            let mut plan_iter = plan.iter().peekable();
            for (i, slot) in self.slots.iter_mut().enumerate() {
                let Some((_, work)) = plan_iter.next_if(|(j, _)| *j == i) else {
                    continue;
                };
                let Some(active) = &slot.active else { continue };
                let (tokens, logits) = match work {
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
                wants_logits.push(logits == Logits::Last);
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
        let rows: usize = plan
            .iter()
            .map(|(_, w)| match w {
                Work::Prefill { from, to } => to - from,
                Work::Decode(_) => 1,
                Work::Ready | Work::Idle => 0,
            })
            .sum();
        let prefill = rows
            - plan
                .iter()
                .filter(|(_, w)| matches!(w, Work::Decode(_)))
                .count();
        let sequences = plan.iter().filter(|(_, w)| *w != Work::Ready).count();
        let output = match result {
            Ok(o) => o,
            Err(e) => {
                self.fail(&plan, &e.to_string());
                return;
            }
        };
        let n_vocab = self.backend.config().n_vocab;
        let mut logit_rows = output.logits.chunks(n_vocab);
        let mut generated = 0u64;
        let mut wants = wants_logits.into_iter();
        for (index, work) in &plan {
            if *work == Work::Ready {
                let ready = self.slots[*index]
                    .active
                    .as_mut()
                    .and_then(|a| a.ready.take());
                generated += u64::from(self.advance(*index, work, ready.as_deref()));
                continue;
            }
            let logits = if wants.next() == Some(true) {
                logit_rows.next()
            } else {
                None
            };
            generated += u64::from(self.advance(*index, work, logits));
        }
        self.shared
            .metrics
            .step(rows, sequences, prefill, generated, self.busy());
    }

    /// Records what slot `index` ingested and, with logits, samples its next token; returns
    /// whether a token was generated.
    fn advance(&mut self, index: usize, work: &Work, logits: Option<&[f32]>) -> bool {
        self.tick += 1;
        let tick = self.tick;
        let slot = &mut self.slots[index];
        let Some(active) = slot.active.as_mut() else {
            return false;
        };
        match *work {
            Work::Decode(t) => {
                slot.cache.extend(&[t]);
                active.pending = None;
            }
            Work::Prefill { from, to } => {
                slot.cache.extend(&active.job.prompt[from..to]);
                active.next_prompt = to;
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
            return false;
        };
        let outcome = active.take_logits(logits, self.tokenizer);
        let reason = match outcome {
            Ok(Outcome::Continue) => return true,
            Ok(Outcome::Done(reason)) => reason,
            Err(e) => {
                if let Some(active) = slot.active.take() {
                    active.job.sink.send(Event::Failed(e));
                }
                self.shared.metrics.failed();
                return false;
            }
        };
        let generated = !matches!(reason, StopReason::EndOfGeneration);
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
        generated
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
