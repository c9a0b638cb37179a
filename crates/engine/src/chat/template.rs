//! A GGUF `tokenizer.chat_template` compiled with MiniJinja and configured like transformers'
//! Jinja2 environment: `trim_blocks`, `lstrip_blocks`, loop controls, Python string methods,
//! `tojson` as `json.dumps(ensure_ascii=False)`, values printed with Python's `str()`, and
//! `raise_exception`. Rendering is bounded by fuel and a recursion limit, since templates come
//! from model files.

use minijinja::value::{Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, State};

use super::python::{py_json, py_str};
use super::{ChatError, ChatMessage};

/// Instructions a single render may execute (a long conversation takes tens of thousands).
pub const TEMPLATE_FUEL: u64 = 10_000_000;
/// Nesting depth a render may reach.
pub const TEMPLATE_RECURSION_LIMIT: usize = 100;

const TEMPLATE_NAME: &str = "chat_template";

/// What to render besides the messages.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RenderOptions {
    /// End with the assistant header so the model writes the next turn.
    pub add_generation_prompt: bool,
    /// `enable_thinking` as the Qwen3 template reads it; `None` leaves it undefined
    /// (thinking on).
    pub enable_thinking: Option<bool>,
    /// Tool definitions (JSON schema objects, OpenAI shape); `None` passes `tools = none`.
    pub tools: Option<Vec<serde_json::Value>>,
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` (the GGUF's `tokenizer.chat_template`).
    pub fn new(source: &str) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION_LIMIT);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| out.write_str(&py_str(value)).map_err(Error::from));
        env.add_filter("tojson", |value: &Value| {
            Value::from_safe_string(py_json(value))
        });
        env.add_filter("string", |value: &Value| py_str(value));
        // Python's None is not iterable (MiniJinja iterates it as empty).
        env.add_test("iterable", |value: &Value| {
            value.kind() != ValueKind::None && value.try_iter().is_ok()
        });
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatError::Parse(describe(&e)))?;
        Ok(ChatTemplate { env })
    }

    /// The prompt text for `messages`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
    ) -> Result<String, ChatError> {
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).map_err(render_err)?,
        );
        ctx.insert(
            "tools".into(),
            options.tools.as_ref().map_or(serde_json::Value::Null, |t| {
                serde_json::Value::Array(t.clone())
            }),
        );
        ctx.insert(
            "add_generation_prompt".into(),
            options.add_generation_prompt.into(),
        );
        if let Some(enable) = options.enable_thinking {
            ctx.insert("enable_thinking".into(), enable.into());
        }
        template
            .render(Value::from_serialize(&ctx))
            .map_err(|e| match e.kind() {
                ErrorKind::InvalidOperation if is_raised(&e) => {
                    ChatError::Raised(e.detail().unwrap_or_default().to_string())
                }
                _ => ChatError::Render(describe(&e)),
            })
    }
}

const RAISED_PREFIX: &str = "raise_exception: ";

fn raise_exception(_state: &State, message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

fn is_raised(e: &Error) -> bool {
    e.detail().is_some_and(|d| d.starts_with(RAISED_PREFIX))
}

fn render_err(e: serde_json::Error) -> ChatError {
    ChatError::Render(e.to_string())
}

/// The error with its template line, and its causes.
fn describe(e: &Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::QWEN3_CHAT_TEMPLATE;

    #[test]
    fn renders_a_simple_chat() {
        let t = ChatTemplate::new(QWEN3_CHAT_TEMPLATE).expect("compile");
        let text = t
            .render(
                &[ChatMessage::new("user", "Hi")],
                &RenderOptions {
                    add_generation_prompt: true,
                    enable_thinking: Some(false),
                    tools: None,
                },
            )
            .expect("render");
        assert_eq!(
            text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    #[test]
    fn raise_exception_and_fuel_are_errors() {
        let t = ChatTemplate::new("{{ raise_exception('no system') }}").expect("compile");
        match t.render(&[], &RenderOptions::default()) {
            Err(ChatError::Raised(msg)) => assert!(msg.contains("no system"), "{msg}"),
            other => panic!("expected Raised, got {other:?}"),
        }
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        )
        .expect("compile");
        assert!(matches!(
            t.render(&[], &RenderOptions::default()),
            Err(ChatError::Render(_))
        ));
        assert!(matches!(
            ChatTemplate::new("{% if %}"),
            Err(ChatError::Parse(_))
        ));
    }

    #[test]
    fn python_semantics() {
        let t = ChatTemplate::new(
            "{{ x }}|{{ x | string }}|{{ y | tojson }}|{{ none is iterable }}|{{ 'a b'.split(' ')[1] }}",
        )
        .expect("compile");
        let env_ctx =
            Value::from_serialize(serde_json::json!({"x": true, "y": {"b": "<", "a": [1.0]}}));
        let out = t
            .env
            .get_template(TEMPLATE_NAME)
            .and_then(|tpl| tpl.render(env_ctx))
            .expect("render");
        assert_eq!(out, r#"True|True|{"b": "<", "a": [1.0]}|False|b"#);
    }
}
