//! Incremental detokenization: token pieces can end inside a multi-byte UTF-8 character
//! (byte-level BPE splits emoji and CJK freely), so bytes are held back until they complete.

use super::{Tokenizer, TokenizerError};

/// Longest UTF-8 sequence; an incomplete tail is always shorter than this.
const MAX_UTF8_LEN: usize = 4;

/// Feeds token ids one by one and returns only whole characters.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    render_special: bool,
    /// Bytes of an incomplete trailing UTF-8 sequence.
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer, render_special: bool) -> Self {
        Self {
            tokenizer,
            render_special,
            pending: Vec::with_capacity(MAX_UTF8_LEN),
        }
    }

    /// Adds token `id`; returns the text that became complete (possibly empty). Bytes that
    /// can never start or continue a character are replaced by U+FFFD right away.
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tokenizer.render_piece(id, self.render_special)?;
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending_bytes(&self) -> &[u8] {
        &self.pending
    }

    /// Ends the stream: an incomplete trailing sequence becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(text) => {
                    out.push_str(text);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // valid_up_to marks a checked UTF-8 prefix.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete at the end: wait for more bytes.
                        None => {
                            rest = after;
                            break;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = after.get(bad..).unwrap_or_default();
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        out
    }
}
