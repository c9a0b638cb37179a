//! The generation loop: prefill a prompt, then sample, stream and stop.

use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::sampling::{Sampler, SamplingParams, StopMatcher};
use crate::session::Runner;
use crate::speculative::{MtpStats, Speculator, Step};
use crate::tokenizer::{StreamDecoder, Tokenizer};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// Tokens to feed before sampling (the whole prompt, or what the session has not seen).
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends before any of these strings; it is not emitted.
    pub stop: Vec<String>,
    /// Print special tokens (e.g. `<think>`) as text.
    pub render_special: bool,
    /// Speculative decoding with the MTP block: tokens drafted per step (0: off; the
    /// session must have the MTP block enabled otherwise).
    pub draft: usize,
}

/// Why generation ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token.
    EndOfGeneration,
    /// `max_tokens` reached.
    Length,
    /// A stop string.
    StopString(String),
    /// The context is full.
    ContextFull,
    /// The caller asked to stop (Ctrl-C, a client that went away).
    Cancelled,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug)]
pub struct GenerateStats {
    pub prompt_tokens: usize,
    pub generated: Vec<u32>,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub stop: StopReason,
    /// Draft and acceptance counts, with speculative decoding.
    pub mtp: Option<MtpStats>,
}

impl GenerateStats {
    pub fn prefill_tokens_per_second(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_seconds.max(1e-9)
    }

    /// Decode speed over the tokens after the first (whose logits came from the prefill).
    pub fn decode_tokens_per_second(&self) -> f64 {
        self.generated.len().saturating_sub(1) as f64 / self.decode_seconds.max(1e-9)
    }
}

/// Runs one generation. `on_text` receives text as it becomes safe to show (whole UTF-8
/// characters, never part of a stop string) and returns `false` to cancel.
pub fn generate(
    session: &mut dyn Runner,
    tokenizer: &Tokenizer,
    req: &GenerateRequest,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<GenerateStats> {
    let mut sampler = Sampler::new(req.sampling.clone())?;
    for &t in &req.prompt {
        sampler.accept(t);
    }
    let start = Instant::now();
    let logits = session.feed(&req.prompt, false, false)?.logits;
    let prefill_seconds = start.elapsed().as_secs_f64();

    let mut out = Emitter {
        tokenizer,
        decoder: tokenizer.stream_decoder(req.render_special),
        stops: StopMatcher::new(req.stop.iter().cloned()),
        generated: Vec::new(),
        max_tokens: req.max_tokens,
        on_text,
    };
    let mut speculator = match req.draft {
        0 => None,
        n => Some(Speculator::new(n, None)?),
    };
    let decode_start = Instant::now();
    let mut token = sampler.sample(&logits)?;
    let stop = loop {
        if let Some(reason) = out.emit(token)? {
            break reason;
        }
        sampler.accept(token);
        // Drafts that fit in the token budget and the context (one more row verifies them).
        let budget = req.max_tokens - out.generated.len();
        let room = session.capacity().saturating_sub(session.pos() + 1);
        let n = speculator
            .as_ref()
            .map_or(0, |s| s.draft.min(budget - 1).min(room));
        if let (Some(spec), true) = (speculator.as_mut(), n > 0) {
            match spec.step(session, &mut sampler, token, n, &mut |d| out.emit(d))? {
                Step::Next(next) => token = next,
                Step::Stop(reason) => break reason,
            }
            continue;
        }
        // Plain greedy: the backend picks the token (on the GPU: no logits to the host).
        let next = match sampler.plain_greedy() {
            true => session.step_greedy(token),
            false => session
                .step(token)
                .and_then(|logits| Ok(sampler.sample(logits)?)),
        };
        match next {
            Ok(next) => token = next,
            Err(EngineError::ContextFull { .. }) => break StopReason::ContextFull,
            Err(e) => return Err(e),
        }
    };
    let Emitter {
        mut decoder,
        mut stops,
        generated,
        on_text,
        ..
    } = out;
    if !matches!(stop, StopReason::StopString(_) | StopReason::Cancelled) {
        let tail = decoder.finish();
        let out = stops.push(&tail);
        let rest = out.text + &stops.finish();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(GenerateStats {
        prompt_tokens: req.prompt.len(),
        generated,
        prefill_seconds,
        decode_seconds: decode_start.elapsed().as_secs_f64(),
        stop,
        mtp: speculator.map(|s| s.stats),
    })
}

/// Emits generated tokens: text through the stop matcher to the caller, and the checks
/// that end a generation.
struct Emitter<'a, 'f> {
    tokenizer: &'a Tokenizer,
    decoder: StreamDecoder<'a>,
    stops: StopMatcher,
    generated: Vec<u32>,
    max_tokens: usize,
    on_text: &'f mut dyn FnMut(&str) -> bool,
}

impl Emitter<'_, '_> {
    /// Emits `token`; returns why generation ends with it, if it does.
    fn emit(&mut self, token: u32) -> Result<Option<StopReason>> {
        if self.tokenizer.is_eog(token) {
            return Ok(Some(StopReason::EndOfGeneration));
        }
        self.generated.push(token);
        let piece = self.decoder.push(token)?;
        let out = self.stops.push(&piece);
        if !out.text.is_empty() && !(self.on_text)(&out.text) {
            return Ok(Some(StopReason::Cancelled));
        }
        if let Some(s) = out.stopped_by {
            return Ok(Some(StopReason::StopString(s)));
        }
        if self.generated.len() >= self.max_tokens {
            return Ok(Some(StopReason::Length));
        }
        Ok(None)
    }
}
