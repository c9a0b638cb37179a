//! The bridge to the scheduler: a job's events arrive on a channel; dropping the receiver
//! (the client went away, the handler future was dropped) cancels the job at the next step.
//! Plus the JSON pieces both endpoints share: usage, finish reasons, log-probabilities.

use redlite_engine::generate::StopReason;
use redlite_engine::serve::{Event, EventSink, Finish, Job, TokenLogprobs};
use redlite_engine::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::convert::Infallible;

use axum::response::sse::Event as SseEvent;
use tokio::sync::mpsc::{unbounded_channel, Sender, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::AppState;

struct ChannelSink(UnboundedSender<Event>);

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// What a request asks the engine for.
pub struct Ask {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: redlite_engine::sampling::SamplingParams,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
}

/// Queues the job; its events come on the returned channel.
pub fn submit(state: &AppState, ask: Ask) -> Result<UnboundedReceiver<Event>, ApiError> {
    let (tx, rx) = unbounded_channel();
    state.handle.submit(Job {
        prompt: ask.prompt,
        max_tokens: ask.max_tokens,
        sampling: ask.sampling,
        stop: ask.stop,
        render_special: true,
        logprobs: ask.logprobs,
        sink: Box::new(ChannelSink(tx)),
    })?;
    Ok(rx)
}

/// OpenAI's `finish_reason`.
pub fn finish_reason(reason: &StopReason, tool_calls: bool) -> &'static str {
    match reason {
        StopReason::Length | StopReason::ContextFull => "length",
        _ if tool_calls => "tool_calls",
        _ => "stop",
    }
}

pub fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": f.cached_tokens},
    })
}

/// A token as text (lossy where it is part of a UTF-8 sequence) and its bytes.
fn token_text(tokenizer: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tokenizer
        .render_piece(id, true)
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// One entry of a chat response's `logprobs.content`.
pub fn chat_logprob(tokenizer: &Tokenizer, id: u32, lp: &TokenLogprobs) -> Value {
    let (token, bytes) = token_text(tokenizer, id);
    let top: Vec<Value> = lp
        .top
        .iter()
        .map(|&(t, l)| {
            let (token, bytes) = token_text(tokenizer, t);
            json!({"token": token, "logprob": l, "bytes": bytes})
        })
        .collect();
    json!({"token": token, "logprob": lp.logprob, "bytes": bytes, "top_logprobs": top})
}

/// The legacy completions shape, accumulated token by token.
#[derive(Default)]
pub struct LegacyLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<serde_json::Map<String, Value>>,
    offsets: Vec<usize>,
    text_len: usize,
}

impl LegacyLogprobs {
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32, lp: &TokenLogprobs) {
        let (token, _) = token_text(tokenizer, id);
        self.offsets.push(self.text_len);
        self.text_len += token.len();
        self.tokens.push(token);
        self.token_logprobs.push(lp.logprob);
        self.top.push(
            lp.top
                .iter()
                .map(|&(t, l)| (token_text(tokenizer, t).0, json!(l)))
                .collect(),
        );
    }

    pub fn take(&mut self) -> Value {
        let v = json!({
            "tokens": self.tokens,
            "token_logprobs": self.token_logprobs,
            "top_logprobs": self.top,
            "text_offset": self.offsets,
        });
        *self = LegacyLogprobs {
            text_len: self.text_len,
            ..LegacyLogprobs::default()
        };
        v
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A request id with a prefix (`chatcmpl-`, `cmpl-`): time and a process-wide counter.
pub fn request_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}{:x}{nanos:08x}{n:06x}", now())
}

/// The event stream of a streamed response.
pub type SseTx = Sender<Result<SseEvent, Infallible>>;

/// What every chunk of a stream repeats.
pub struct StreamHead<'a> {
    pub id: &'a str,
    pub object: &'static str,
    pub created: u64,
    pub model: &'a str,
}

/// The end of a stream: the usage chunk when asked for, then `[DONE]`.
pub async fn finish_stream(tx: &SseTx, head: &StreamHead<'_>, usage: Option<&Finish>) {
    if let Some(f) = usage {
        let body = json!({
            "id": head.id,
            "object": head.object,
            "created": head.created,
            "model": head.model,
            "choices": [],
            "usage": self::usage(f),
        });
        let _ = tx
            .send(Ok(SseEvent::default().data(body.to_string())))
            .await;
    }
    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
}

/// A job that failed mid-stream: an OpenAI error object as an event, then `[DONE]`.
pub async fn fail_stream(tx: &SseTx, why: String) {
    let body = ApiError::server(why).body().to_string();
    let _ = tx.send(Ok(SseEvent::default().data(body))).await;
    let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
}
