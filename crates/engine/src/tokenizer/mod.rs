//! Qwen2/Qwen3 byte-level BPE tokenizer built from a GGUF's `tokenizer.ggml.*` metadata,
//! producing the same ids as llama.cpp.
//!
//! * Text is first split at special/added tokens ([`special`]); control tokens only with
//!   `parse_special`, user-defined ones always (llama.cpp's `tokenizer_st_partition`).
//! * Raw fragments go through the `tokenizers` crate: the qwen2 split regex, the GPT-2 byte
//!   mapping, and BPE over the file's merges. No normalizer (llama.cpp does not apply HF's NFC)
//!   and no BOS (`add_bos_token` is false for Qwen).
//! * Decoding maps each id to its bytes (`token_piece`); [`StreamDecoder`] turns a stream of
//!   ids into text without ever emitting a partial UTF-8 sequence.
//!
//! Only `tokenizer.ggml.model = "gpt2"` with `tokenizer.ggml.pre = "qwen2"` is accepted; other
//! values are refused rather than tokenized with the wrong rules.

mod error;
mod source;
mod special;
mod stream;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel as ByteLevelPreTokenizer;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

pub use error::TokenizerError;
pub use source::TokenKind;
pub use stream::StreamDecoder;

use crate::vocab::{ByteLevel, Vocabulary};
use source::{VocabSource, EOG_TEXTS};
use special::{Fragment, SpecialTokens};

/// The qwen2 pre-tokenizer split regex (Qwen2/Qwen3 `tokenizer.json`, llama.cpp
/// `LLAMA_VOCAB_PRE_TYPE_QWEN2`). Note the single-digit `\p{N}` alternative.
pub const QWEN2_SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A loaded tokenizer. Cheap to share by reference; encoding takes `&self`.
pub struct Tokenizer {
    /// BPE model + pre-tokenizer for raw text (no added tokens: [`SpecialTokens`] does that).
    bpe: tokenizers::Tokenizer,
    specials: SpecialTokens,
    kinds: Vec<TokenKind>,
    /// Bytes of every token, concatenated; token `i` is `pieces[piece_ends[i-1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    piece_ends: Vec<usize>,
    /// End-of-generation ids, ascending.
    eog_ids: Vec<u32>,
    eos_token_id: Option<u32>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.kinds.len())
            .field("eog_ids", &self.eog_ids)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF's `tokenizer.ggml.*` keys.
    pub fn from_metadata(md: &redlite_gguf::Metadata) -> Result<Tokenizer, TokenizerError> {
        Self::build(&VocabSource::from_metadata(md)?)
    }

    /// Builds the tokenizer from a vocabulary in GGUF shape (see [`crate::vocab`]).
    pub fn from_vocabulary(vocab: &Vocabulary) -> Result<Tokenizer, TokenizerError> {
        Self::build(&VocabSource::from_vocabulary(vocab))
    }

    fn build(src: &VocabSource<'_>) -> Result<Tokenizer, TokenizerError> {
        src.check()?;
        let kinds = src.kinds();
        let byte_level = ByteLevel::new();

        let mut vocab = Vocab::default();
        let mut pieces = Vec::new();
        let mut piece_ends = Vec::with_capacity(src.tokens.len());
        for (id, (text, kind)) in src.tokens.iter().zip(&kinds).enumerate() {
            // check() bounded the count by u32.
            let id = u32::try_from(id).map_err(|_| TokenizerError::TooManyTokens {
                count: src.tokens.len(),
            })?;
            match kind {
                TokenKind::Normal => {
                    vocab.insert((*text).to_string(), id);
                    // A string outside the byte mapping renders as itself, like llama.cpp.
                    match byte_level.decode(text) {
                        Some(bytes) => pieces.extend_from_slice(&bytes),
                        None => pieces.extend_from_slice(text.as_bytes()),
                    }
                }
                TokenKind::Control | TokenKind::UserDefined => {
                    pieces.extend_from_slice(text.as_bytes())
                }
                TokenKind::Unused => {}
            }
            piece_ends.push(pieces.len());
        }

        let merges = src
            .merges
            .iter()
            .enumerate()
            .map(|(index, merge)| {
                merge
                    .split_once(' ')
                    .map(|(a, b)| (a.to_string(), b.to_string()))
                    .ok_or_else(|| TokenizerError::MalformedMerge {
                        index,
                        merge: (*merge).to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let model = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let split = Split::new(
            SplitPattern::Regex(QWEN2_SPLIT_REGEX.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| TokenizerError::Build(e.to_string()))?;
        let pre_tokenizer = Sequence::new(vec![
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(ByteLevelPreTokenizer::new(false, false, false)),
        ]);
        let mut bpe = tokenizers::Tokenizer::new(model);
        bpe.with_pre_tokenizer(Some(pre_tokenizer));

        let eos_token_id = src.eos_token_id.and_then(|id| u32::try_from(id).ok());
        let mut eog_ids: Vec<u32> = src
            .tokens
            .iter()
            .enumerate()
            .filter(|(_, text)| EOG_TEXTS.contains(text))
            .filter_map(|(id, _)| u32::try_from(id).ok())
            .chain(eos_token_id)
            .collect();
        eog_ids.sort_unstable();
        eog_ids.dedup();

        Ok(Tokenizer {
            bpe,
            specials: SpecialTokens::new(&src.tokens, &kinds),
            kinds,
            pieces,
            piece_ends,
            eog_ids,
            eos_token_id,
        })
    }

    /// Number of token ids (embedding rows), filler included.
    pub fn vocab_size(&self) -> usize {
        self.kinds.len()
    }

    /// Token ids of `text`. With `parse_special`, control tokens written in the text
    /// (`<|im_start|>`) become their ids; without it they are tokenized as plain text.
    /// Added tokens such as `<think>` are matched either way. No BOS is added.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = Vec::new();
        for fragment in self.specials.partition(text, parse_special) {
            match fragment {
                Fragment::Token(id) => ids.push(id),
                Fragment::Raw(raw) => {
                    let encoding = self
                        .bpe
                        .encode_fast(raw, false)
                        .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                    ids.extend_from_slice(encoding.get_ids());
                }
            }
        }
        Ok(ids)
    }

    /// The bytes token `id` stands for: byte-level decoded for BPE tokens, the text itself
    /// for special and added tokens, nothing for filler rows. A piece may be part of a
    /// multi-byte UTF-8 character.
    pub fn token_piece(&self, id: u32) -> Result<&[u8], TokenizerError> {
        let index = id as usize;
        let end = *self
            .piece_ends
            .get(index)
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                vocab_size: self.kinds.len(),
            })?;
        let start = match index {
            0 => 0,
            _ => self.piece_ends.get(index - 1).copied().unwrap_or(0),
        };
        Ok(self.pieces.get(start..end).unwrap_or_default())
    }

    /// The kind of token `id` (control, user-defined, ...), as llama.cpp classifies it.
    pub fn token_kind(&self, id: u32) -> Option<TokenKind> {
        self.kinds.get(id as usize).copied()
    }

    /// The bytes to show for `id`: its piece, except control tokens when `render_special`
    /// is false (llama.cpp `token_to_piece(special = false)`).
    pub fn render_piece(&self, id: u32, render_special: bool) -> Result<&[u8], TokenizerError> {
        let piece = self.token_piece(id)?;
        match self.kinds.get(id as usize) {
            Some(TokenKind::Control) if !render_special => Ok(&[]),
            _ => Ok(piece),
        }
    }

    /// Text of `ids`. Invalid UTF-8 (a sequence cut by the end of `ids`) becomes U+FFFD.
    /// Control tokens are written out only with `render_special`.
    pub fn decode(&self, ids: &[u32], render_special: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            bytes.extend_from_slice(self.render_piece(id, render_special)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// End-of-generation ids, ascending: `tokenizer.ggml.eos_token_id` plus the tokens
    /// llama.cpp stops on (`<|endoftext|>`, `<|im_end|>`, `<|fim_pad|>`, `<|repo_name|>`,
    /// `<|file_sep|>`).
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog_ids
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog_ids.binary_search(&id).is_ok()
    }

    /// `tokenizer.ggml.eos_token_id`, if the file has one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// A decoder that turns ids, one at a time, into complete UTF-8 text.
    pub fn stream_decoder(&self, render_special: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, render_special)
    }
}
