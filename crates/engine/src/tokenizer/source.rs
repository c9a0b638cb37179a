//! The `tokenizer.ggml.*` arrays a tokenizer is built from, read from GGUF metadata or from a
//! [`Vocabulary`], and the llama.cpp token attributes derived from them.

use redlite_gguf::{Metadata, Value};

use super::error::TokenizerError;
use crate::vocab::{Vocabulary, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED};

/// `tokenizer.ggml.token_type` of an unknown token (llama.cpp matches it in text like a control
/// token).
const TOKEN_TYPE_UNKNOWN: i32 = 2;

/// Texts llama.cpp treats as end-of-generation (the Qwen family's part of its list); it also
/// forces these to control tokens when the file marks them user-defined.
pub(super) const EOG_TEXTS: [&str; 5] = [
    "<|endoftext|>",
    "<|im_end|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
];

/// Texts llama.cpp forces to control tokens (EOT / FIM detection) besides [`EOG_TEXTS`].
const CONTROL_LOOKING_TEXTS: [&str; 3] = ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"];

/// What llama.cpp does with a token when tokenizing and detokenizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    /// A BPE token: produced by merges, rendered through the byte-level mapping.
    Normal,
    /// A special token: matched in text only with `parse_special`, rendered only on request.
    Control,
    /// An added token: always matched in text, always rendered verbatim.
    UserDefined,
    /// A filler row (or a type this engine does not know): never produced, renders empty.
    Unused,
}

/// The vocabulary arrays, borrowed from their owner.
pub(super) struct VocabSource<'a> {
    pub model: &'a str,
    pub pre: &'a str,
    pub tokens: Vec<&'a str>,
    /// One `TOKEN_TYPE_*` per token; all normal when the file has no type array.
    pub token_types: Vec<i32>,
    pub merges: Vec<&'a str>,
    pub eos_token_id: Option<u64>,
}

impl<'a> VocabSource<'a> {
    pub fn from_vocabulary(v: &'a Vocabulary) -> Self {
        Self {
            model: &v.model,
            pre: &v.pre,
            tokens: v.tokens.iter().map(String::as_str).collect(),
            token_types: v.token_types.clone(),
            merges: v.merges.iter().map(String::as_str).collect(),
            eos_token_id: Some(u64::from(v.eos_token_id)),
        }
    }

    pub fn from_metadata(md: &'a Metadata) -> Result<Self, TokenizerError> {
        let model = string_key(md, "tokenizer.ggml.model")?;
        let pre = string_key(md, "tokenizer.ggml.pre")?;
        let tokens = string_array(md, "tokenizer.ggml.tokens")?;
        let merges = string_array(md, "tokenizer.ggml.merges")?;
        let token_types = match md.get("tokenizer.ggml.token_type") {
            None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
            Some(value) => value
                .as_array()
                .and_then(|items| {
                    items
                        .iter()
                        .map(|v| v.as_i64().and_then(|t| i32::try_from(t).ok()))
                        .collect::<Option<Vec<i32>>>()
                })
                .ok_or_else(|| wrong_type("tokenizer.ggml.token_type", "array of i32", value))?,
        };
        let eos_token_id = match md.get("tokenizer.ggml.eos_token_id") {
            None => None,
            Some(value) => Some(value.as_u64().ok_or_else(|| {
                wrong_type("tokenizer.ggml.eos_token_id", "unsigned integer", value)
            })?),
        };
        Ok(Self {
            model,
            pre,
            tokens,
            token_types,
            merges,
            eos_token_id,
        })
    }

    /// Refuses anything but GPT-2 byte-level BPE with the qwen2 pre-tokenizer, and arrays of
    /// different lengths.
    pub fn check(&self) -> Result<(), TokenizerError> {
        if self.model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel {
                found: self.model.to_string(),
            });
        }
        if self.pre != "qwen2" {
            return Err(TokenizerError::UnsupportedPre {
                found: self.pre.to_string(),
            });
        }
        if self.tokens.len() != self.token_types.len() {
            return Err(TokenizerError::TypeCountMismatch {
                tokens: self.tokens.len(),
                token_types: self.token_types.len(),
            });
        }
        if u32::try_from(self.tokens.len()).is_err() {
            return Err(TokenizerError::TooManyTokens {
                count: self.tokens.len(),
            });
        }
        if let Some(id) = self.eos_token_id {
            if id >= self.tokens.len() as u64 {
                return Err(TokenizerError::SpecialIdOutOfRange {
                    key: "tokenizer.ggml.eos_token_id",
                    id,
                    vocab_size: self.tokens.len(),
                });
            }
        }
        Ok(())
    }

    /// The kind of each token, with llama.cpp's override of control-looking added tokens.
    pub fn kinds(&self) -> Vec<TokenKind> {
        self.tokens
            .iter()
            .zip(&self.token_types)
            .map(|(text, &token_type)| match token_type {
                TOKEN_TYPE_NORMAL => TokenKind::Normal,
                TOKEN_TYPE_CONTROL | TOKEN_TYPE_UNKNOWN => TokenKind::Control,
                TOKEN_TYPE_USER_DEFINED
                    if EOG_TEXTS.contains(text) || CONTROL_LOOKING_TEXTS.contains(text) =>
                {
                    TokenKind::Control
                }
                TOKEN_TYPE_USER_DEFINED => TokenKind::UserDefined,
                // Unused filler, and byte tokens (SentencePiece only).
                _ => TokenKind::Unused,
            })
            .collect()
    }
}

fn wrong_type(key: &'static str, expected: &'static str, found: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: found.describe(),
    }
}

fn string_key<'a>(md: &'a Metadata, key: &'static str) -> Result<&'a str, TokenizerError> {
    let value = md.get(key).ok_or(TokenizerError::MissingKey { key })?;
    value
        .as_str()
        .ok_or_else(|| wrong_type(key, "string", value))
}

fn string_array<'a>(md: &'a Metadata, key: &'static str) -> Result<Vec<&'a str>, TokenizerError> {
    let value = md.get(key).ok_or(TokenizerError::MissingKey { key })?;
    value
        .as_array()
        .and_then(|items| {
            items
                .iter()
                .map(Value::as_str)
                .collect::<Option<Vec<&str>>>()
        })
        .ok_or_else(|| wrong_type(key, "array of strings", value))
}
