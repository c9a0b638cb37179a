//! The request bodies of `/v1/chat/completions` and `/v1/completions`, with the fields users
//! send, and their translation into engine settings. Unknown fields are ignored (clients
//! send many); fields of the wrong type are refused by the parser.

use redlite_engine::chat::{ChatMessage, ToolCall};
use redlite_engine::sampling::SamplingParams;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Settings shared by both endpoints.
#[derive(Debug, Deserialize)]
pub struct Common {
    #[serde(default)]
    pub stream: bool,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Not OpenAI, but sent by most local clients (llama.cpp, vLLM accept it).
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub max_tokens: Option<u64>,
    pub stop: Option<Stop>,
    pub seed: Option<u64>,
    pub n: Option<u64>,
}

/// One part of a content array: only text parts are understood.
#[derive(Debug, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    #[serde(flatten)]
    pub common: Common,
    pub messages: Vec<Message>,
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<u64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub response_format: Option<Value>,
    /// Template variables, as vLLM and llama.cpp accept them (`enable_thinking`).
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// `prompt`: a string, a list with one string, or token ids.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    #[serde(flatten)]
    pub common: Common,
    pub prompt: Prompt,
    /// The number of alternatives per token to return (OpenAI's legacy shape).
    pub logprobs: Option<u64>,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
}

/// Most alternatives a request may ask for per token (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: u64 = 20;
/// Most stop strings a request may send.
const MAX_STOPS: usize = 16;

/// Parses a body, turning every parse failure into a 400 that says what was wrong.
pub fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    if std::str::from_utf8(body).is_err() {
        return Err(ApiError::bad_request("the request body is not valid UTF-8"));
    }
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the request body is not valid JSON"
        } else {
            "invalid request"
        };
        ApiError::bad_request(format!("{what}: {e}"))
    })
}

impl Message {
    /// The engine's message; text parts are joined, other parts refused.
    pub fn to_chat(&self) -> Result<ChatMessage, ApiError> {
        if !matches!(
            self.role.as_str(),
            "system" | "developer" | "user" | "assistant" | "tool"
        ) {
            return Err(ApiError::bad_request(format!(
                "unknown role {:?} (expected system, developer, user, assistant or tool)",
                self.role
            ))
            .with_param("messages"));
        }
        let content = match &self.content {
            None => String::new(),
            Some(Content::Text(t)) => t.clone(),
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => text.push_str(t),
                        (kind, _) => {
                            return Err(ApiError::bad_request(format!(
                                "content part of type {kind:?} is not supported (text only)"
                            ))
                            .with_param("messages"))
                        }
                    }
                }
                text
            }
        };
        // The template knows system, user, assistant and tool; OpenAI's newer `developer`
        // role is the system prompt.
        let role = if self.role == "developer" {
            "system"
        } else {
            &self.role
        };
        Ok(ChatMessage {
            role: role.to_string(),
            content,
            reasoning_content: self.reasoning_content.clone(),
            tool_calls: self.tool_calls.clone().unwrap_or_default(),
            tool_call_id: self.tool_call_id.clone(),
            name: self.name.clone(),
        })
    }
}

impl Common {
    /// Sampling settings with OpenAI's defaults (temperature 1, top_p 1, no top-k or
    /// min-p, no penalties); a seed is drawn when none is given.
    pub fn sampling(&self) -> Result<SamplingParams, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad_request("only n = 1 is supported").with_param("n"));
        }
        let range = |name: &'static str, v: Option<f32>, lo: f32, hi: f32| match v {
            Some(x) if !(lo..=hi).contains(&x) || !x.is_finite() => Err(ApiError::bad_request(
                format!("{name} = {x} is out of range [{lo}, {hi}]"),
            )
            .with_param(name)),
            _ => Ok(v),
        };
        let temperature = range("temperature", self.temperature, 0.0, 2.0)?.unwrap_or(1.0);
        let top_p = range("top_p", self.top_p, 0.0, 1.0)?.unwrap_or(1.0);
        let min_p = range("min_p", self.min_p, 0.0, 1.0)?.unwrap_or(0.0);
        let presence = range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        let frequency = range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        let repetition = range("repetition_penalty", self.repetition_penalty, 0.01, 10.0)?;
        let top_k = match self.top_k {
            None => 0,
            Some(k) if k <= 0 => 0,
            Some(k) => k as usize,
        };
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        Ok(SamplingParams {
            temperature,
            top_k,
            // A top-p of 0 means "the single best token" to OpenAI clients.
            top_p: if top_p <= 0.0 {
                f32::MIN_POSITIVE
            } else {
                top_p
            },
            min_p,
            repeat_penalty: repetition.unwrap_or(1.0),
            presence_penalty: presence.unwrap_or(0.0),
            frequency_penalty: frequency.unwrap_or(0.0),
            penalty_last_n: 256,
            seed,
        })
    }

    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(
                ApiError::bad_request(format!("at most {MAX_STOPS} stop strings"))
                    .with_param("stop"),
            );
        }
        Ok(stops)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }
}

/// `max_tokens` (or `max_completion_tokens`): at least 1; by default the rest of the context.
pub fn max_tokens(asked: Option<u64>, prompt: usize, context: usize) -> Result<usize, ApiError> {
    match asked {
        Some(0) => {
            Err(ApiError::bad_request("max_tokens must be at least 1").with_param("max_tokens"))
        }
        Some(n) => Ok(usize::try_from(n).unwrap_or(usize::MAX)),
        None => Ok(context.saturating_sub(prompt).max(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_types_and_bad_json_are_400s() {
        for body in [
            &br#"{"messages": "hi"}"#[..],
            br#"{"messages": [], "temperature": "hot"}"#,
            br#"{"messages": [{"role": "user", "content": 5}]}"#,
            br#"{"messages": [{"role": "user""#,
            b"\xff\xfe",
        ] {
            let err = parse::<ChatRequest>(body).expect_err("must fail");
            assert_eq!(err.status, axum::http::StatusCode::BAD_REQUEST);
        }
    }

    #[test]
    fn content_parts_join_and_roles_are_checked() {
        let req: ChatRequest = parse(
            br#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], "top_k": 5}"#,
        )
        .expect("parse");
        assert_eq!(req.messages[0].to_chat().expect("message").content, "ab");
        assert_eq!(req.common.sampling().expect("sampling").top_k, 5);
        let req: ChatRequest =
            parse(br#"{"messages": [{"role": "wizard", "content": "x"}]}"#).expect("parse");
        assert!(req.messages[0].to_chat().is_err());
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        let req: ChatRequest = parse(br#"{"messages": [], "temperature": 3}"#).expect("parse");
        assert!(req.common.sampling().is_err());
        let req: ChatRequest = parse(br#"{"messages": [], "n": 2}"#).expect("parse");
        assert!(req.common.sampling().is_err());
        assert!(max_tokens(Some(0), 1, 10).is_err());
        assert_eq!(max_tokens(None, 4, 10).expect("default"), 6);
    }
}
