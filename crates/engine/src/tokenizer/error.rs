//! Errors of the tokenizer.

use thiserror::Error;

/// Why a tokenizer could not be built, or a text / token id could not be handled.
#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error("tokenizer: metadata key {key:?} is missing")]
    MissingKey { key: &'static str },

    #[error("tokenizer: metadata key {key:?} holds {found}, expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },

    #[error("tokenizer: tokenizer.ggml.model {found:?} is not supported (this engine reads \"gpt2\" byte-level BPE)")]
    UnsupportedModel { found: String },

    #[error("tokenizer: pre-tokenizer tokenizer.ggml.pre {found:?} is not supported (this engine reads \"qwen2\")")]
    UnsupportedPre { found: String },

    #[error("tokenizer: {tokens} tokens but {token_types} token types")]
    TypeCountMismatch { tokens: usize, token_types: usize },

    #[error("tokenizer: merge {index} {merge:?} is not two space-separated tokens")]
    MalformedMerge { index: usize, merge: String },

    #[error("tokenizer: {key} = {id} is outside the vocabulary of {vocab_size} tokens")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u64,
        vocab_size: usize,
    },

    #[error("tokenizer: vocabulary of {count} tokens does not fit u32 ids")]
    TooManyTokens { count: usize },

    #[error("tokenizer: building the BPE model failed: {0}")]
    Build(String),

    #[error("tokenizer: encoding failed: {0}")]
    Encode(String),

    #[error("tokenizer: token id {id} is outside the vocabulary of {vocab_size} tokens")]
    TokenOutOfRange { id: u32, vocab_size: usize },
}
