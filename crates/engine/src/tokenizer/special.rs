//! Splitting text at special and added tokens before BPE, the way llama.cpp's
//! `tokenizer_st_partition` does: tokens are tried longest text first, and each one splits every
//! remaining raw fragment at all its occurrences, left to right.

use super::source::TokenKind;

/// A piece of the input: raw text still to be BPE-encoded, or a token matched verbatim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fragment<'t> {
    Raw(&'t str),
    Token(u32),
}

/// The tokens matched verbatim in text, longest text first.
#[derive(Debug, Clone)]
pub(super) struct SpecialTokens {
    /// `(id, text, kind)`; kind is control or user-defined.
    by_length: Vec<(u32, String, TokenKind)>,
}

impl SpecialTokens {
    pub fn new(tokens: &[&str], kinds: &[TokenKind]) -> Self {
        let mut by_length: Vec<(u32, String, TokenKind)> = tokens
            .iter()
            .zip(kinds)
            .enumerate()
            .filter(|(_, (text, kind))| {
                !text.is_empty() && matches!(kind, TokenKind::Control | TokenKind::UserDefined)
            })
            .filter_map(|(id, (text, &kind))| {
                Some((u32::try_from(id).ok()?, text.to_string(), kind))
            })
            .collect();
        // Stable: equal lengths keep id order.
        by_length.sort_by_key(|token| std::cmp::Reverse(token.1.len()));
        Self { by_length }
    }

    /// Splits `text` into raw fragments and matched tokens. Without `parse_special` only
    /// user-defined tokens are matched (control tokens stay text), as in llama.cpp and HF.
    pub fn partition<'t>(&self, text: &'t str, parse_special: bool) -> Vec<Fragment<'t>> {
        let mut fragments = vec![Fragment::Raw(text)];
        for (id, token_text, kind) in &self.by_length {
            if !parse_special && *kind == TokenKind::Control {
                continue;
            }
            if !fragments
                .iter()
                .any(|f| matches!(f, Fragment::Raw(raw) if raw.contains(token_text.as_str())))
            {
                continue;
            }
            let mut next = Vec::with_capacity(fragments.len() + 2);
            for fragment in fragments {
                match fragment {
                    Fragment::Raw(raw) => split_raw(raw, token_text, *id, &mut next),
                    token => next.push(token),
                }
            }
            fragments = next;
        }
        fragments
    }
}

/// Appends `raw` split at every occurrence of `token_text` (non-empty pieces only).
fn split_raw<'t>(raw: &'t str, token_text: &str, id: u32, out: &mut Vec<Fragment<'t>>) {
    let mut rest = raw;
    while let Some(at) = rest.find(token_text) {
        let (left, tail) = rest.split_at(at);
        if !left.is_empty() {
            out.push(Fragment::Raw(left));
        }
        out.push(Fragment::Token(id));
        rest = tail.get(token_text.len()..).unwrap_or_default();
    }
    if !rest.is_empty() {
        out.push(Fragment::Raw(rest));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials() -> SpecialTokens {
        let tokens = ["a", "<|im_end|>", "<think>", "<|im", "x"];
        let kinds = [
            TokenKind::Normal,
            TokenKind::Control,
            TokenKind::UserDefined,
            TokenKind::UserDefined,
            TokenKind::Unused,
        ];
        SpecialTokens::new(&tokens, &kinds)
    }

    #[test]
    fn longest_token_wins_and_all_occurrences_split() {
        let parts = specials().partition("x<|im_end|>y<|im<think><think>", true);
        assert_eq!(
            parts,
            vec![
                Fragment::Raw("x"),
                Fragment::Token(1),
                Fragment::Raw("y"),
                Fragment::Token(3),
                Fragment::Token(2),
                Fragment::Token(2),
            ]
        );
    }

    #[test]
    fn control_tokens_stay_text_without_parse_special() {
        let parts = specials().partition("<|im_end|><think>", false);
        assert_eq!(
            parts,
            vec![
                Fragment::Token(3),
                Fragment::Raw("_end|>"),
                Fragment::Token(2),
            ]
        );
    }
}
