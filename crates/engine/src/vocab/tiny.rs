//! A small but valid Qwen-style BPE vocabulary for test models.
//!
//! Layout (`M` = [`TINY_MERGE_COUNT`]):
//! * ids `0..256`: the single bytes, id = byte value (GPT-2 strings, type normal);
//! * ids `256..256 + M`: the `M` lowest-ranked multi-byte tokens of the real Qwen vocabulary,
//!   in rank order, each with the merge the real vocabulary uses for it (merge `i` creates
//!   token `256 + i`);
//! * the 26 Qwen added tokens, same order and types as in the real vocabulary;
//! * `[PAD{id}]` filler (type unused) up to `vocab_size`.
//!
//! So the special ids differ from the real model: `<|endoftext|>` (padding and bos) is
//! `256 + M` and `<|im_end|>` (eos) is `256 + M + 2`; read them from the [`Vocabulary`].
//! Because the merges are a rank-ordered prefix of the real ones, every part of every merge is
//! already a token and llama.cpp's `qwen2` pre-tokenizer plus BPE work unchanged; text
//! tokenizes into more, shorter tokens than with the full vocabulary.

use super::byte_level::ByteLevel;
use super::qwen::merge_strings;
use super::ranks::{derive_merges, load_qwen_ranks};
use super::{finish_vocabulary, VocabError, Vocabulary, QWEN_ADDED_TOKENS, TOKEN_TYPE_NORMAL};

/// Merges (and multi-byte tokens) in the tiny vocabulary.
pub const TINY_MERGE_COUNT: usize = 256;

/// Smallest `vocab_size` [`tiny_vocabulary`] accepts: bytes, merged tokens and added tokens.
pub const fn tiny_min_vocab_size() -> usize {
    256 + TINY_MERGE_COUNT + QWEN_ADDED_TOKENS.len()
}

/// The tiny test vocabulary padded to `vocab_size` rows (at least [`tiny_min_vocab_size`]).
pub fn tiny_vocabulary(vocab_size: usize) -> Result<Vocabulary, VocabError> {
    if vocab_size < tiny_min_vocab_size() {
        return Err(VocabError::VocabTooSmall {
            builder: "tiny",
            minimum: tiny_min_vocab_size(),
            requested: vocab_size,
        });
    }
    let ranks = load_qwen_ranks()?;
    let single_bytes: Vec<[u8; 1]> = (0..=255u8).map(|b| [b]).collect();
    // Single-byte ranks never take part in the replay (it only looks up joined pairs), so
    // putting the bytes first in byte order leaves every derived merge as in the real vocabulary.
    let token_slices: Vec<&[u8]> = single_bytes
        .iter()
        .map(|b| b.as_slice())
        .chain(
            ranks
                .iter()
                .filter(|t| t.len() >= 2)
                .take(TINY_MERGE_COUNT)
                .map(Vec::as_slice),
        )
        .collect();
    let byte_level = ByteLevel::new();
    let merges = merge_strings(&token_slices, &derive_merges(&token_slices)?, &byte_level);
    if merges.len() != TINY_MERGE_COUNT {
        return Err(VocabError::MergeCount {
            expected: TINY_MERGE_COUNT,
            found: merges.len(),
        });
    }
    let tokens: Vec<String> = token_slices.iter().map(|t| byte_level.encode(t)).collect();
    let token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
    finish_vocabulary("tiny", tokens, token_types, merges, vocab_size)
}
