//! Splits streamed model text into what OpenAI clients expect: thinking between `<think>` and
//! `</think>` becomes `reasoning_content`, each `<tool_call>{"name", "arguments"}</tool_call>`
//! block (Qwen's format) becomes a tool call, the rest is `content`. Works on text pieces as
//! they arrive: a piece that may be the start of a tag is held until it is known.

use serde_json::Value;

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// A parsed tool call; `arguments` is a JSON string as OpenAI sends it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedCall {
    pub name: String,
    pub arguments: String,
}

/// One piece of output, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    Content(String),
    Reasoning(String),
    ToolCall(ParsedCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Content,
    Reasoning,
    ToolCall,
}

pub struct OutputParser {
    mode: Mode,
    /// Text not yet classified (a possible partial tag, or an unfinished tool call).
    held: String,
    parse_tools: bool,
    /// Drop newlines at the start of content (after `</think>` the model writes "\n\n").
    trim_start: bool,
}

impl OutputParser {
    /// `in_thinking`: the prompt ended inside `<think>` (the template opened it).
    /// `parse_tools`: the request offered tools.
    pub fn new(in_thinking: bool, parse_tools: bool) -> OutputParser {
        OutputParser {
            mode: if in_thinking {
                Mode::Reasoning
            } else {
                Mode::Content
            },
            held: String::new(),
            parse_tools,
            trim_start: true,
        }
    }

    /// Whether a prompt ends inside an opened `<think>` block.
    pub fn prompt_opens_thinking(prompt: &str) -> bool {
        match (prompt.rfind(THINK_OPEN), prompt.rfind(THINK_CLOSE)) {
            (Some(open), Some(close)) => open > close,
            (Some(_), None) => true,
            _ => false,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let tags: &[&str] = match self.mode {
                Mode::Content if self.parse_tools => &[THINK_OPEN, TOOL_OPEN],
                Mode::Content => &[THINK_OPEN],
                Mode::Reasoning => &[THINK_CLOSE],
                Mode::ToolCall => &[TOOL_CLOSE],
            };
            let found = tags
                .iter()
                .filter_map(|t| self.held.find(t).map(|at| (at, *t)))
                .min_by_key(|&(at, _)| at);
            match found {
                Some((at, tag)) => {
                    let before: String = self.held[..at].to_string();
                    self.held.drain(..at + tag.len());
                    match self.mode {
                        Mode::ToolCall => out.push(parse_call(&before)),
                        _ => self.emit(&before, &mut out),
                    }
                    self.mode = match tag {
                        THINK_OPEN => Mode::Reasoning,
                        TOOL_OPEN => Mode::ToolCall,
                        THINK_CLOSE => {
                            self.trim_start = true;
                            Mode::Content
                        }
                        _ => Mode::Content,
                    };
                }
                None => {
                    if self.mode != Mode::ToolCall {
                        // Keep only a suffix that could start one of the tags.
                        let keep = tags
                            .iter()
                            .map(|t| partial_tag_len(&self.held, t))
                            .max()
                            .unwrap_or(0);
                        let cut = self.held.len() - keep;
                        let ready: String = self.held[..cut].to_string();
                        self.held.drain(..cut);
                        self.emit(&ready, &mut out);
                    }
                    return out;
                }
            }
        }
    }

    /// The end of the output: unfinished blocks come out as they are.
    pub fn finish(&mut self) -> Vec<Delta> {
        let rest = std::mem::take(&mut self.held);
        let mut out = Vec::new();
        match self.mode {
            Mode::ToolCall => {
                let raw = format!("{TOOL_OPEN}{rest}");
                self.mode = Mode::Content;
                self.emit(&raw, &mut out);
            }
            _ => self.emit(&rest, &mut out),
        }
        out
    }

    fn emit(&mut self, text: &str, out: &mut Vec<Delta>) {
        let text = match self.mode {
            Mode::Content if self.trim_start => {
                let t = text.trim_start_matches(['\n', '\r']);
                if !t.is_empty() {
                    self.trim_start = false;
                }
                t
            }
            _ => text,
        };
        if text.is_empty() {
            return;
        }
        let delta = match self.mode {
            Mode::Reasoning => Delta::Reasoning(text.to_string()),
            _ => Delta::Content(text.to_string()),
        };
        match (out.last_mut(), delta) {
            (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
            (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
            (_, d) => out.push(d),
        }
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag`.
fn partial_tag_len(text: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| {
            text.len() >= n
                && text.is_char_boundary(text.len() - n)
                && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

/// A `<tool_call>` body: `{"name": ..., "arguments": {...}}`. Anything else stays text.
fn parse_call(body: &str) -> Delta {
    let parsed: Option<ParsedCall> =
        serde_json::from_str::<Value>(body.trim())
            .ok()
            .and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let arguments = match v.get("arguments") {
                    None => "{}".to_string(),
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => other.to_string(),
                };
                Some(ParsedCall { name, arguments })
            });
    match parsed {
        Some(call) => Delta::ToolCall(call),
        None => Delta::Content(format!("{TOOL_OPEN}{body}{TOOL_CLOSE}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `text` in pieces of `step` bytes (on char boundaries) and merges the deltas.
    fn run(text: &str, step: usize, in_thinking: bool, tools: bool) -> Vec<Delta> {
        let mut p = OutputParser::new(in_thinking, tools);
        let mut all = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            all.extend(p.push(&text[i..j]));
            i = j;
        }
        all.extend(p.finish());
        let mut merged: Vec<Delta> = Vec::new();
        for d in all {
            match (merged.last_mut(), d) {
                (Some(Delta::Content(a)), Delta::Content(b)) => a.push_str(&b),
                (Some(Delta::Reasoning(a)), Delta::Reasoning(b)) => a.push_str(&b),
                (_, d) => merged.push(d),
            }
        }
        merged
    }

    #[test]
    fn thinking_then_content_in_any_piece_size() {
        let text = "<think>\nLet me see: 2+2.\n</think>\n\nThe answer is 4 — é.";
        for step in [1, 2, 3, 7, 100] {
            assert_eq!(
                run(text, step, false, false),
                vec![
                    Delta::Reasoning("\nLet me see: 2+2.\n".into()),
                    Delta::Content("The answer is 4 — é.".into()),
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn a_template_opened_think_block() {
        assert!(OutputParser::prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n"
        ));
        assert!(!OutputParser::prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n\n</think>\n\n"
        ));
        assert_eq!(
            run("plan</think>\n\nok", 2, true, false),
            vec![Delta::Reasoning("plan".into()), Delta::Content("ok".into())]
        );
    }

    #[test]
    fn qwen_tool_calls() {
        let text = "I'll check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        for step in [1, 5, 1000] {
            assert_eq!(
                run(text, step, false, true),
                vec![
                    Delta::Content("I'll check.\n".into()),
                    Delta::ToolCall(ParsedCall {
                        name: "get_weather".into(),
                        arguments: "{\"city\":\"Paris\"}".into()
                    }),
                    Delta::Content("\n".into()),
                    Delta::ToolCall(ParsedCall {
                        name: "now".into(),
                        arguments: "{}".into()
                    }),
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn malformed_or_unfinished_calls_stay_text_and_tools_off_means_text() {
        assert_eq!(
            run("<tool_call>not json</tool_call>", 3, false, true),
            vec![Delta::Content("<tool_call>not json</tool_call>".into())]
        );
        assert_eq!(
            run("<tool_call>{\"name\": \"x\"", 3, false, true),
            vec![Delta::Content("<tool_call>{\"name\": \"x\"".into())]
        );
        assert_eq!(
            run("a<tool_call>b", 1, false, false),
            vec![Delta::Content("a<tool_call>b".into())]
        );
        assert_eq!(
            run("a <thi", 1, false, false),
            vec![Delta::Content("a <thi".into())]
        );
    }
}
