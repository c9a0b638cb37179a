//! One sequence on one backend: prefill in chunks, decode token by token, reset, snapshot.

use crate::backend::{Backend, SeqState};
use crate::error::{EngineError, Result};
use crate::model::forward::{forward, Logits, Output, Workspace};
use crate::state::KvType;

/// Default prefill chunk (`--chunk`).
pub const DEFAULT_CHUNK: usize = 512;

pub struct Session<B: Backend> {
    pub backend: B,
    pub state: B::State,
    work: Workspace<B>,
    chunk: usize,
}

impl<B: Backend> Session<B> {
    /// A session with a KV cache of `context` positions, prefilling `chunk` tokens at a time.
    pub fn new(backend: B, context: usize, kv_type: KvType, chunk: usize) -> Result<Session<B>> {
        if chunk == 0 {
            return Err(EngineError::BadConfig(
                "the prefill chunk must be at least 1 token".into(),
            ));
        }
        let state = backend.new_state(context, kv_type);
        let work = Workspace::new(&backend, chunk);
        Ok(Session {
            backend,
            state,
            work,
            chunk,
        })
    }

    pub fn n_vocab(&self) -> usize {
        self.backend.config().n_vocab
    }

    /// Back to an empty sequence (the cache keeps its size).
    pub fn reset(&mut self) {
        self.state.reset_state();
    }

    /// Tokens processed so far.
    pub fn pos(&self) -> usize {
        self.state.pos()
    }

    /// Feeds `tokens` in chunks; returns the logits of the last one (or of all with `all`),
    /// and with `capture_hidden` the per-layer residual stream of every chunk, concatenated.
    pub fn feed(&mut self, tokens: &[u32], all: bool, capture_hidden: bool) -> Result<Output> {
        if tokens.is_empty() {
            return Err(EngineError::BadConfig("no tokens to process".into()));
        }
        self.state.check_room(tokens.len())?;
        let mut total = Output::default();
        let n_chunks = tokens.len().div_ceil(self.chunk);
        for (i, piece) in tokens.chunks(self.chunk).enumerate() {
            let want = match (all, i + 1 == n_chunks) {
                (true, _) => Logits::All,
                (false, true) => Logits::Last,
                (false, false) => Logits::None,
            };
            let out = forward(
                &self.backend,
                &mut self.state,
                &mut self.work,
                piece,
                want,
                capture_hidden,
            )?;
            total.logits.extend_from_slice(&out.logits);
            if total.hidden.is_empty() {
                total.hidden = out.hidden;
            } else {
                for (acc, layer) in total.hidden.iter_mut().zip(out.hidden) {
                    acc.extend_from_slice(&layer);
                }
            }
        }
        Ok(total)
    }

    /// Logits after one more token.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        Ok(self.feed(&[token], false, false)?.logits)
    }
}

/// A session seen without its backend type: what the generation loop, the benchmarks and
/// the CLI need, so one code path drives any backend.
pub trait Runner {
    /// See [`Session::feed`].
    fn feed(&mut self, tokens: &[u32], all: bool, capture_hidden: bool) -> Result<Output>;
    /// Logits after one more token.
    fn step(&mut self, token: u32) -> Result<Vec<f32>>;
    /// Back to an empty sequence.
    fn reset(&mut self);
    /// Tokens processed so far.
    fn pos(&self) -> usize;
    fn n_vocab(&self) -> usize;
}

impl<B: Backend> Runner for Session<B> {
    fn feed(&mut self, tokens: &[u32], all: bool, capture_hidden: bool) -> Result<Output> {
        Session::feed(self, tokens, all, capture_hidden)
    }
    fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        Session::step(self, token)
    }
    fn reset(&mut self) {
        Session::reset(self)
    }
    fn pos(&self) -> usize {
        Session::pos(self)
    }
    fn n_vocab(&self) -> usize {
        Session::n_vocab(self)
    }
}
