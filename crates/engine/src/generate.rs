//! The generation loop: prefill a prompt, then sample, stream and stop.

use std::time::Instant;

use crate::error::{EngineError, Result};
use crate::sampling::{Sampler, SamplingParams, StopMatcher};
use crate::session::Runner;
use crate::tokenizer::Tokenizer;

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
    let mut logits = session.feed(&req.prompt, false, false)?.logits;
    let prefill_seconds = start.elapsed().as_secs_f64();

    let mut decoder = tokenizer.stream_decoder(req.render_special);
    let mut stops = StopMatcher::new(req.stop.iter().cloned());
    let mut generated = Vec::new();
    let decode_start = Instant::now();
    let stop = loop {
        let token = sampler.sample(&logits)?;
        if tokenizer.is_eog(token) {
            break StopReason::EndOfGeneration;
        }
        sampler.accept(token);
        generated.push(token);
        let piece = decoder.push(token)?;
        let out = stops.push(&piece);
        if !out.text.is_empty() && !on_text(&out.text) {
            break StopReason::Cancelled;
        }
        if let Some(s) = out.stopped_by {
            break StopReason::StopString(s);
        }
        if generated.len() >= req.max_tokens {
            break StopReason::Length;
        }
        match session.step(token) {
            Ok(next) => logits = next,
            Err(EngineError::ContextFull { .. }) => break StopReason::ContextFull,
            Err(e) => return Err(e),
        }
    };
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
    })
}
