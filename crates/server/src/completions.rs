//! `POST /v1/completions`: a raw prompt (text or token ids), no template, no output parsing.

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use redlite_engine::serve::Event;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::job::{self, Ask, LegacyLogprobs};
use crate::request::{self, CompletionRequest, Prompt, MAX_TOP_LOGPROBS};
use crate::{body, Shared};

fn prepare(state: &Shared, bytes: &[u8]) -> Result<(Ask, bool, bool), ApiError> {
    let req: CompletionRequest = request::parse(bytes)?;
    if req.echo || req.suffix.is_some() {
        return Err(ApiError::bad_request("echo and suffix are not supported"));
    }
    let logprobs = match req.logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::bad_request(format!(
                "logprobs must be at most {MAX_TOP_LOGPROBS}"
            ))
            .with_param("logprobs"))
        }
        n => n.map(|n| n as usize),
    };
    let text = match &req.prompt {
        Prompt::Text(t) => Some(t.as_str()),
        Prompt::Texts(v) if v.len() == 1 => Some(v[0].as_str()),
        Prompt::Texts(_) => {
            return Err(
                ApiError::bad_request("one prompt per request is supported").with_param("prompt")
            )
        }
        Prompt::Tokens(_) => None,
    };
    let prompt = match (text, &req.prompt) {
        (Some(t), _) => state
            .tokenizer
            .encode(t, true)
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
        (None, Prompt::Tokens(ids)) => ids.clone(),
        (None, _) => Vec::new(),
    };
    let max_tokens = request::max_tokens(
        req.common.max_tokens,
        prompt.len(),
        state.handle.config().context,
    )?;
    let ask = Ask {
        prompt,
        max_tokens,
        sampling: req.common.sampling()?,
        stop: req.common.stops()?,
        logprobs,
    };
    Ok((ask, req.common.stream, req.common.include_usage()))
}

pub async fn handle(
    State(state): State<Shared>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(bytes)?;
    let (ask, stream, include_usage) = prepare(&state, &bytes)?;
    let want_logprobs = ask.logprobs.is_some();
    let events = job::submit(&state, ask)?;
    if stream {
        return Ok(stream_events(state, events, want_logprobs, include_usage).into_response());
    }
    collect(&state, events, want_logprobs).await
}

async fn collect(
    state: &Shared,
    mut events: mpsc::UnboundedReceiver<Event>,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut logprobs = LegacyLogprobs::default();
    let finish = loop {
        match events.recv().await {
            Some(Event::Token {
                id,
                text: t,
                logprobs: lp,
            }) => {
                text.push_str(&t);
                if let Some(lp) = lp {
                    logprobs.push(&state.tokenizer, id, &lp);
                }
            }
            Some(Event::Text(t)) => text.push_str(&t),
            Some(Event::Started { .. }) => {}
            Some(Event::Done(f)) => break f,
            Some(Event::Failed(why)) => return Err(ApiError::server(why)),
            None => return Err(ApiError::server("the job ended without a result")),
        }
    };
    Ok(Json(json!({
        "id": job::request_id("cmpl-"),
        "object": "text_completion",
        "created": job::now(),
        "model": state.model_id,
        "choices": [{
            "index": 0,
            "text": text,
            "logprobs": if want_logprobs { logprobs.take() } else { Value::Null },
            "finish_reason": job::finish_reason(&finish.reason, false),
        }],
        "usage": job::usage(&finish),
    }))
    .into_response())
}

fn stream_events(
    state: Shared,
    mut events: mpsc::UnboundedReceiver<Event>,
    want_logprobs: bool,
    include_usage: bool,
) -> impl IntoResponse {
    let (tx, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let id = job::request_id("cmpl-");
        let created = job::now();
        let chunk = |text: &str, logprobs: Value, finish: Value| {
            let body = json!({
                "id": id,
                "object": "text_completion",
                "created": created,
                "model": state.model_id,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
            });
            Ok(SseEvent::default().data(body.to_string()))
        };
        let mut logprobs = LegacyLogprobs::default();
        let finish = loop {
            let event = tokio::select! {
                e = events.recv() => e,
                () = tx.closed() => return,
            };
            let (text, lp) = match event {
                Some(Event::Token {
                    id,
                    text,
                    logprobs: lp,
                }) => {
                    let lp = lp.filter(|_| want_logprobs).map(|lp| {
                        logprobs.push(&state.tokenizer, id, &lp);
                        logprobs.take()
                    });
                    (text, lp)
                }
                Some(Event::Text(text)) => (text, None),
                Some(Event::Started { .. }) => continue,
                Some(Event::Done(f)) => break f,
                Some(Event::Failed(why)) => {
                    job::fail_stream(&tx, why).await;
                    return;
                }
                None => return,
            };
            if (text.is_empty() && lp.is_none())
                || tx
                    .send(chunk(&text, lp.unwrap_or(Value::Null), Value::Null))
                    .await
                    .is_ok()
            {
                continue;
            }
            return;
        };
        let reason = job::finish_reason(&finish.reason, false);
        let _ = tx.send(chunk("", Value::Null, json!(reason))).await;
        let head = job::StreamHead {
            id: &id,
            object: "text_completion",
            created,
            model: &state.model_id,
        };
        job::finish_stream(&tx, &head, include_usage.then_some(&finish)).await;
    });
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}
