//! Serving many requests on one model: a scheduler thread owns the backend and `slots`
//! sequence states, runs the decode steps of every active slot as one batched forward
//! (continuous batching), interleaves prompt prefill in fixed chunks so running streams keep
//! flowing, reuses DeltaNet/KV state across requests through snapshots at turn ends (a hybrid
//! model's recurrent state cannot be truncated, so reuse resumes from the longest snapshot
//! that is a prefix of the new prompt), and keeps a bounded queue when every slot is busy.
//!
//! The HTTP layer (the `server` crate) renders and tokenizes a request, `submit`s a [`Job`],
//! and receives [`Event`]s through the job's [`EventSink`]; a sink that reports itself closed
//! (the client went away) frees its slot at the next step.

mod metrics;
mod prefix;
mod scheduler;
mod slot;
mod speculate;

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

pub use metrics::MetricsSnapshot;

use crate::backend::Backend;
use crate::error::{EngineError, Result};
use crate::generate::StopReason;
use crate::sampling::{Sampler, SamplingParams};
use crate::state::KvType;
use crate::tokenizer::Tokenizer;
use metrics::Metrics;

/// How the scheduler is sized.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Sequences served at once, each with its own KV cache and DeltaNet state.
    pub slots: usize,
    /// Positions of each slot's KV cache (prompt + completion).
    pub context: usize,
    pub kv_type: KvType,
    /// Prompt tokens a slot ingests per step; a prompt is always cut at the same points, so a
    /// request's result does not depend on the load.
    pub chunk: usize,
    /// Requests that may wait for a slot; more are refused (`SubmitError::QueueFull`).
    pub queue_limit: usize,
    /// State snapshots each slot keeps for prompt reuse (the DeltaNet state of one snapshot
    /// is ~75 MB on the full-size model).
    pub snapshots_per_slot: usize,
    /// MTP speculative decoding: tokens the MTP block drafts per step and slot (0: off; the
    /// backend must have the MTP block loaded otherwise).
    pub draft: usize,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig {
            slots: 4,
            context: 4096,
            kv_type: KvType::F32,
            chunk: 256,
            queue_limit: 64,
            snapshots_per_slot: 4,
            draft: 0,
        }
    }
}

/// One request, tokenized.
pub struct Job {
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (the EOG token is not counted).
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends before any of these strings; they are not emitted.
    pub stop: Vec<String>,
    /// Emit special tokens (`<think>`, `<tool_call>`) as text.
    pub render_special: bool,
    /// `Some(n)`: every token's log-probability and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    pub sink: Box<dyn EventSink>,
}

/// Where a job's events go. Called from the scheduler thread; must not block.
pub trait EventSink: Send {
    /// Delivers an event; `false` when nobody listens any more (the job is then cancelled).
    fn send(&self, event: Event) -> bool;
    /// The listener is gone (checked every step, also while the job waits or prefills).
    fn is_closed(&self) -> bool;
}

/// Log-probabilities of one sampled token, from the model's logits (before sampling
/// settings), natural log.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
}

/// What a job produced so far.
#[derive(Clone, Debug)]
pub enum Event {
    /// The job has a slot; `cached_tokens` of the prompt were reused from an earlier request.
    Started {
        slot: usize,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    /// A sampled token and the text that became safe to show with it (may be empty: an
    /// incomplete UTF-8 sequence, or text that may start a stop string).
    Token {
        id: u32,
        text: String,
        logprobs: Option<TokenLogprobs>,
    },
    /// Text released at the end, after the last token.
    Text(String),
    Done(Finish),
    /// The job failed (a backend error); nothing more follows.
    Failed(String),
}

/// The end of a job: why, exact counts and timings.
#[derive(Clone, Debug)]
pub struct Finish {
    pub reason: StopReason,
    pub prompt_tokens: usize,
    /// Prompt tokens not ingested because a snapshot held them.
    pub cached_tokens: usize,
    /// Tokens sampled, the EOG token excluded.
    pub completion_tokens: usize,
    pub queue_seconds: f64,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
}

/// Why `submit` refused a job.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("this model's maximum context length is {context} tokens, but the prompt has {prompt} tokens")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("this model's maximum context length is {context} tokens; the request asks for {} ({prompt} in the prompt, {max_tokens} to generate)", prompt + max_tokens)]
    TooManyTokens {
        prompt: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error("every slot is busy and {waiting} requests are waiting; retry later")]
    QueueFull { waiting: usize },
    #[error("{0}")]
    BadSampling(String),
    #[error("the scheduler has stopped")]
    Stopped,
}

/// A job waiting for a slot.
struct Pending {
    job: Job,
    since: Instant,
}

/// What the handles and the scheduler thread share.
struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    metrics: Metrics,
}

struct Queue {
    jobs: VecDeque<Pending>,
    stopped: bool,
}

impl Shared {
    fn queue(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves a consistent queue (push/pop only).
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Submits jobs to the scheduler thread and reads its metrics. Cheap to clone.
#[derive(Clone)]
pub struct Handle {
    shared: Arc<Shared>,
    config: ServeConfig,
    n_vocab: usize,
}

impl Handle {
    pub fn config(&self) -> &ServeConfig {
        &self.config
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Queues a job, or refuses it at once (too long, bad settings, queue full).
    pub fn submit(&self, job: Job) -> std::result::Result<(), SubmitError> {
        let context = self.config.context;
        let prompt = job.prompt.len();
        if prompt == 0 {
            return Err(SubmitError::EmptyPrompt);
        }
        if job.max_tokens == 0 {
            return Err(SubmitError::BadSampling(
                "max_tokens must be at least 1".into(),
            ));
        }
        if prompt > context {
            return Err(SubmitError::PromptTooLong { prompt, context });
        }
        if prompt + job.max_tokens > context {
            return Err(SubmitError::TooManyTokens {
                prompt,
                max_tokens: job.max_tokens,
                context,
            });
        }
        if let Some(&id) = job.prompt.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(SubmitError::BadSampling(format!(
                "token id {id} is outside the vocabulary of {}",
                self.n_vocab
            )));
        }
        Sampler::new(job.sampling.clone()).map_err(|e| SubmitError::BadSampling(e.to_string()))?;
        let mut queue = self.shared.queue();
        if queue.stopped {
            return Err(SubmitError::Stopped);
        }
        if queue.jobs.len() >= self.config.queue_limit {
            self.shared.metrics.rejected();
            return Err(SubmitError::QueueFull {
                waiting: queue.jobs.len(),
            });
        }
        queue.jobs.push_back(Pending {
            job,
            since: Instant::now(),
        });
        self.shared.metrics.queued(queue.jobs.len());
        drop(queue);
        self.shared.wake.notify_one();
        Ok(())
    }

    pub fn metrics(&self) -> MetricsSnapshot {
        let waiting = self.shared.queue().jobs.len();
        self.shared.metrics.snapshot(waiting)
    }

    /// Stops the scheduler after the current step; queued jobs fail.
    pub fn shutdown(&self) {
        self.shared.queue().stopped = true;
        self.shared.wake.notify_all();
    }
}

/// Starts the scheduler thread: `make_backend` runs on it (so the backend need not be
/// `Send`), then it serves until `shutdown`. Returns once the backend and the slots exist.
pub fn spawn<B, F>(
    make_backend: F,
    tokenizer: Arc<Tokenizer>,
    config: ServeConfig,
) -> Result<Handle>
where
    B: Backend,
    F: FnOnce() -> Result<B> + Send + 'static,
{
    if config.slots == 0 || config.chunk == 0 || config.context == 0 {
        return Err(EngineError::BadConfig(
            "slots, chunk and context must each be at least 1".into(),
        ));
    }
    if config.draft > crate::session::MAX_DRAFT {
        return Err(EngineError::BadConfig(format!(
            "drafts per step must be at most {}, got {}",
            crate::session::MAX_DRAFT,
            config.draft
        )));
    }
    let shared = Arc::new(Shared {
        queue: Mutex::new(Queue {
            jobs: VecDeque::new(),
            stopped: false,
        }),
        wake: Condvar::new(),
        metrics: Metrics::new(config.slots),
    });
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<usize>>();
    let thread_shared = shared.clone();
    let thread_config = config.clone();
    std::thread::Builder::new()
        .name("redlite-scheduler".into())
        .spawn(move || {
            let backend = match make_backend() {
                Ok(b) => b,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let mut scheduler = match scheduler::Scheduler::new(
                &backend,
                &tokenizer,
                &thread_config,
                &thread_shared,
            ) {
                Ok(s) => s,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(backend.config().n_vocab));
            scheduler.run();
        })
        .map_err(|e| EngineError::BadConfig(format!("cannot start the scheduler thread: {e}")))?;
    let n_vocab = ready_rx.recv().map_err(|_| {
        EngineError::BadConfig("the scheduler thread stopped while starting".into())
    })??;
    Ok(Handle {
        shared,
        config,
        n_vocab,
    })
}
