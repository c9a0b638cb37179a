//! Chat prompts: the conversation types and the GGUF's Jinja chat template, rendered the way
//! transformers' `apply_chat_template` renders it (byte for byte on the Qwen3 templates; see
//! tests/golden/templates/).

mod python;
mod template;

use serde::{Deserialize, Deserializer, Serialize};

pub use template::{ChatTemplate, RenderOptions, TEMPLATE_FUEL, TEMPLATE_RECURSION_LIMIT};

/// Why a chat template could not be loaded or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template: parsing failed: {0}")]
    Parse(String),
    #[error("chat template: rendering failed: {0}")]
    Render(String),
    #[error("chat template: the template raised: {0}")]
    Raised(String),
}

/// One message of a conversation, in the shape transformers passes to the template. Fields
/// that are `None` / empty are left out, so the template sees them as undefined.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The text; `null` in the input reads as empty.
    #[serde(default, deserialize_with = "null_as_empty")]
    pub content: String,
    /// The assistant's thinking, rendered inside `<think>` by the Qwen3 template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For `tool` messages: the id of the call this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// A tool call made by the assistant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

/// The function a tool call invokes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// A JSON object (what the templates expect; key order is kept), or a JSON string as
    /// OpenAI clients send it, which the Qwen3 template prints verbatim.
    pub arguments: serde_json::Value,
}

fn function_type() -> String {
    "function".to_string()
}

fn null_as_empty<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}
