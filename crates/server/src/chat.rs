//! `POST /v1/chat/completions` (streamed as server-sent events or whole) and
//! `POST /apply-template` (the rendered prompt, for clients and tests).

use std::convert::Infallible;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use redlite_engine::chat::RenderOptions;
use redlite_engine::serve::Event;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::error::ApiError;
use crate::job::{self, Ask};
use crate::output::{Delta, OutputParser};
use crate::request::{self, ChatRequest, MAX_TOP_LOGPROBS};
use crate::{body, Shared};

/// A chat request made ready for the engine.
struct Prepared {
    prompt_text: String,
    ask: Ask,
    parse_tools: bool,
    stream: bool,
    include_usage: bool,
}

fn render(state: &Shared, req: &ChatRequest) -> Result<(String, bool), ApiError> {
    let template = state.template.as_ref().ok_or_else(|| {
        ApiError::bad_request("this model has no chat template; use /v1/completions")
    })?;
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").with_param("messages"));
    }
    let messages = req
        .messages
        .iter()
        .map(|m| m.to_chat())
        .collect::<Result<Vec<_>, _>>()?;
    check_tools(req)?;
    let tools_off = matches!(&req.tool_choice, Some(Value::String(s)) if s == "none");
    let tools = match &req.tools {
        Some(t) if !t.is_empty() && !tools_off => Some(t.clone()),
        _ => None,
    };
    let parse_tools = tools.is_some();
    let enable_thinking = req
        .chat_template_kwargs
        .as_ref()
        .and_then(|k| k.get("enable_thinking"))
        .and_then(Value::as_bool);
    let text = template
        .render(
            &messages,
            &RenderOptions {
                add_generation_prompt: true,
                enable_thinking,
                tools,
            },
        )
        .map_err(|e| ApiError::bad_request(e.to_string()).with_param("messages"))?;
    Ok((text, parse_tools))
}

/// `tools` are function definitions with a name; `tool_choice` is `none`, `auto`,
/// `required`, or one of the functions.
fn check_tools(req: &ChatRequest) -> Result<(), ApiError> {
    let tools = req.tools.as_deref().unwrap_or_default();
    let name_of = |t: &Value| {
        t.get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    for t in tools {
        let is_function = t.get("type").and_then(Value::as_str) == Some("function");
        if !is_function || name_of(t).is_none() {
            return Err(ApiError::bad_request(
                "each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., ...}}",
            )
            .with_param("tools"));
        }
    }
    match &req.tool_choice {
        None => Ok(()),
        Some(Value::String(s)) if matches!(s.as_str(), "none" | "auto" | "required") => Ok(()),
        Some(choice @ Value::Object(_))
            if choice.get("type").and_then(Value::as_str) == Some("function")
                && name_of(choice).is_some_and(|n| tools.iter().any(|t| name_of(t) == Some(n.clone()))) =>
        {
            Ok(())
        }
        Some(_) => Err(ApiError::bad_request(
            "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}} naming one of the tools",
        )
        .with_param("tool_choice")),
    }
}

fn prepare(state: &Shared, bytes: &[u8]) -> Result<Prepared, ApiError> {
    let req: ChatRequest = request::parse(bytes)?;
    if let Some(format) = &req.response_format {
        if format.get("type").and_then(Value::as_str) != Some("text") {
            return Err(ApiError::bad_request(
                "response_format other than {\"type\": \"text\"} is not supported",
            )
            .with_param("response_format"));
        }
    }
    let logprobs = match (req.logprobs, req.top_logprobs) {
        (false, Some(_)) => {
            return Err(ApiError::bad_request("top_logprobs needs logprobs = true")
                .with_param("top_logprobs"))
        }
        (true, Some(n)) if n > MAX_TOP_LOGPROBS => {
            return Err(ApiError::bad_request(format!(
                "top_logprobs must be at most {MAX_TOP_LOGPROBS}"
            ))
            .with_param("top_logprobs"))
        }
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let sampling = req.common.sampling()?;
    let stop = req.common.stops()?;
    let (prompt_text, parse_tools) = render(state, &req)?;
    let prompt = state
        .tokenizer
        .encode(&prompt_text, true)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let asked = req.max_completion_tokens.or(req.common.max_tokens);
    let max_tokens = request::max_tokens(asked, prompt.len(), state.handle.config().context)?;
    Ok(Prepared {
        prompt_text,
        ask: Ask {
            prompt,
            max_tokens,
            sampling,
            stop,
            logprobs,
        },
        parse_tools,
        stream: req.common.stream,
        include_usage: req.common.include_usage(),
    })
}

pub async fn handle(
    State(state): State<Shared>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(bytes)?;
    let prepared = prepare(&state, &bytes)?;
    let in_thinking = OutputParser::prompt_opens_thinking(&prepared.prompt_text);
    let parser = OutputParser::new(in_thinking, prepared.parse_tools);
    let logprobs = prepared.ask.logprobs.is_some();
    let events = job::submit(&state, prepared.ask)?;
    if prepared.stream {
        Ok(stream(state, events, parser, logprobs, prepared.include_usage).into_response())
    } else {
        collect(&state, events, parser, logprobs).await
    }
}

/// The whole answer in one response.
async fn collect(
    state: &Shared,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut parser: OutputParser,
    want_logprobs: bool,
) -> Result<Response, ApiError> {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    let mut logprobs = Vec::new();
    let mut absorb = |deltas: Vec<Delta>| {
        for d in deltas {
            match d {
                Delta::Content(t) => content.push_str(&t),
                Delta::Reasoning(t) => reasoning.push_str(&t),
                Delta::ToolCall(c) => calls.push(c),
            }
        }
    };
    let finish = loop {
        match events.recv().await {
            Some(Event::Token {
                id,
                text,
                logprobs: lp,
            }) => {
                absorb(parser.push(&text));
                if let Some(lp) = lp {
                    logprobs.push(job::chat_logprob(&state.tokenizer, id, &lp));
                }
            }
            Some(Event::Text(text)) => absorb(parser.push(&text)),
            Some(Event::Started { .. }) => {}
            Some(Event::Done(f)) => break f,
            Some(Event::Failed(why)) => return Err(ApiError::server(why)),
            None => return Err(ApiError::server("the job ended without a result")),
        }
    };
    absorb(parser.finish());
    let mut message = json!({
        "role": "assistant",
        "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { json!(content) },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = json!(calls
            .iter()
            .enumerate()
            .map(|(i, c)| tool_call_json(i, c, true))
            .collect::<Vec<_>>());
    }
    let id = job::request_id("chatcmpl-");
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": job::now(),
        "model": state.model_id,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": if want_logprobs { json!({"content": logprobs}) } else { Value::Null },
            "finish_reason": job::finish_reason(&finish.reason, !calls.is_empty()),
        }],
        "usage": job::usage(&finish),
    }))
    .into_response())
}

fn tool_call_json(index: usize, c: &crate::output::ParsedCall, whole: bool) -> Value {
    let call = json!({
        "id": format!("call_{}", job::request_id("")),
        "type": "function",
        "function": {"name": c.name, "arguments": c.arguments},
    });
    if whole {
        call
    } else {
        let mut call = call;
        call["index"] = json!(index);
        call
    }
}

/// Server-sent events: a role chunk, then one chunk per piece of output, the finish chunk,
/// the usage chunk when asked for, and `[DONE]`.
fn stream(
    state: Shared,
    mut events: mpsc::UnboundedReceiver<Event>,
    mut parser: OutputParser,
    want_logprobs: bool,
    include_usage: bool,
) -> impl IntoResponse {
    let (tx, rx) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let id = job::request_id("chatcmpl-");
        let created = job::now();
        let chunk = |delta: Value, logprobs: Value, finish: Value| {
            let body = json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": state.model_id,
                "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
            });
            Ok(SseEvent::default().data(body.to_string()))
        };
        let mut calls = 0usize;
        let send_deltas = |deltas: Vec<Delta>, calls: &mut usize| -> Vec<Value> {
            deltas
                .into_iter()
                .map(|d| match d {
                    Delta::Content(t) => json!({"content": t}),
                    Delta::Reasoning(t) => json!({"reasoning_content": t}),
                    Delta::ToolCall(c) => {
                        *calls += 1;
                        json!({"tool_calls": [tool_call_json(*calls - 1, &c, false)]})
                    }
                })
                .collect()
        };
        if tx
            .send(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
                Value::Null,
            ))
            .await
            .is_err()
        {
            return;
        }
        let finish = loop {
            let event = tokio::select! {
                e = events.recv() => e,
                // The client went away: dropping `events` cancels the job.
                () = tx.closed() => return,
            };
            let (deltas, lp) = match event {
                Some(Event::Token { id, text, logprobs }) => (
                    parser.push(&text),
                    logprobs.map(|lp| job::chat_logprob(&state.tokenizer, id, &lp)),
                ),
                Some(Event::Text(text)) => (parser.push(&text), None),
                Some(Event::Started { .. }) => continue,
                Some(Event::Done(f)) => break f,
                Some(Event::Failed(why)) => {
                    job::fail_stream(&tx, why).await;
                    return;
                }
                None => return,
            };
            let mut deltas = send_deltas(deltas, &mut calls);
            if want_logprobs {
                if let Some(lp) = lp {
                    // Log-probabilities ride on the token's chunk (an empty delta if the
                    // token's text is held back).
                    let first = if deltas.is_empty() {
                        json!({"content": ""})
                    } else {
                        deltas.remove(0)
                    };
                    if tx
                        .send(chunk(first, json!({"content": [lp]}), Value::Null))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
            for d in deltas {
                if tx.send(chunk(d, Value::Null, Value::Null)).await.is_err() {
                    return;
                }
            }
        };
        for d in send_deltas(parser.finish(), &mut calls) {
            if tx.send(chunk(d, Value::Null, Value::Null)).await.is_err() {
                return;
            }
        }
        let reason = job::finish_reason(&finish.reason, calls > 0);
        let _ = tx.send(chunk(json!({}), Value::Null, json!(reason))).await;
        let head = job::StreamHead {
            id: &id,
            object: "chat.completion.chunk",
            created,
            model: &state.model_id,
        };
        job::finish_stream(&tx, &head, include_usage.then_some(&finish)).await;
    });
    Sse::new(ReceiverStream::new(rx)).keep_alive(KeepAlive::default())
}

/// `POST /apply-template`: the prompt text a chat request renders to.
pub async fn apply_template(
    State(state): State<Shared>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let bytes = body(bytes)?;
    let req: ChatRequest = request::parse(&bytes)?;
    let (text, _) = render(&state, &req)?;
    Ok(Json(json!({"prompt": text})))
}
