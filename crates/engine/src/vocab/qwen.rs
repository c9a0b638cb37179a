//! The real Qwen2/Qwen3/Qwen3-Next vocabulary.

use super::byte_level::ByteLevel;
use super::ranks::{derive_merges, load_qwen_ranks, Merge};
use super::{finish_vocabulary, VocabError, Vocabulary, TOKEN_TYPE_NORMAL};

/// BPE tokens (tiktoken ranks) in the Qwen vocabulary.
pub const QWEN_BPE_TOKEN_COUNT: usize = 151_643;
/// Merges derived from the ranks: one per multi-byte token (151,643 minus the 256 single bytes).
pub const QWEN_MERGE_COUNT: usize = 151_387;
/// Id of the first added token (`<|endoftext|>`).
pub const QWEN_FIRST_ADDED_ID: u32 = 151_643;
/// Number of added tokens (`<|endoftext|>` .. `</think>`).
pub const QWEN_ADDED_TOKEN_COUNT: usize = super::QWEN_ADDED_TOKENS.len();
/// Embedding rows of Qwen3-Next (and of the Qwen3 dense models up to 4B): the vocabulary is
/// padded with unused `[PAD{id}]` entries up to this size.
pub const QWEN_VOCAB_SIZE: usize = 151_936;

/// The real Qwen vocabulary, padded with `[PAD{id}]` entries up to `vocab_size` rows.
///
/// Ids 0..151643 are the BPE tokens (id = tiktoken rank), 151643..=151668 the added tokens of
/// [`super::QWEN_ADDED_TOKENS`]; `vocab_size` below 151,669 is refused.
pub fn qwen_vocabulary(vocab_size: usize) -> Result<Vocabulary, VocabError> {
    let minimum = QWEN_BPE_TOKEN_COUNT + QWEN_ADDED_TOKEN_COUNT;
    if vocab_size < minimum {
        // Refuse before spending a second on the merges.
        return Err(VocabError::VocabTooSmall {
            builder: "qwen",
            minimum,
            requested: vocab_size,
        });
    }
    let ranks = load_qwen_ranks()?;
    if ranks.len() != QWEN_BPE_TOKEN_COUNT {
        return Err(VocabError::RankCount {
            expected: QWEN_BPE_TOKEN_COUNT,
            found: ranks.len(),
        });
    }
    let token_slices: Vec<&[u8]> = ranks.iter().map(Vec::as_slice).collect();
    let byte_level = ByteLevel::new();
    let merges = merge_strings(&token_slices, &derive_merges(&token_slices)?, &byte_level);
    if merges.len() != QWEN_MERGE_COUNT {
        return Err(VocabError::MergeCount {
            expected: QWEN_MERGE_COUNT,
            found: merges.len(),
        });
    }
    let tokens: Vec<String> = token_slices.iter().map(|t| byte_level.encode(t)).collect();
    let token_types = vec![TOKEN_TYPE_NORMAL; tokens.len()];
    finish_vocabulary("qwen", tokens, token_types, merges, vocab_size)
}

/// `"left right"` merge strings in GPT-2 encoding. A merge that does not index into `tokens`
/// is dropped (the callers' count checks then fail); `derive_merges` never makes one.
pub(super) fn merge_strings(
    tokens: &[&[u8]],
    merges: &[Merge],
    byte_level: &ByteLevel,
) -> Vec<String> {
    merges
        .iter()
        .filter_map(|m| {
            let token = tokens.get(m.rank as usize)?;
            Some((token.get(..m.split)?, token.get(m.split..)?))
        })
        .map(|(left, right)| {
            let mut s = byte_level.encode(left);
            s.push(' ');
            s.push_str(&byte_level.encode(right));
            s
        })
        .collect()
}
