//! Helpers shared by the vocab integration tests.
// Each test binary uses a different subset.
#![allow(dead_code)]

use std::collections::HashMap;

use redlite_engine::vocab::{ByteLevel, Vocabulary, TOKEN_TYPE_NORMAL};
use sha2::{Digest, Sha256};

pub fn sha256_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn hex_bytes(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// A plain merge-list BPE (what llama.cpp and Hugging Face run after pre-tokenizing): start
/// from single bytes, repeatedly apply the lowest-ranked merge present, leftmost on ties.
pub struct MergeBpe {
    byte_ids: [u32; 256],
    /// (left id, right id) -> (merge rank, merged id)
    merges: HashMap<(u32, u32), (usize, u32)>,
}

impl MergeBpe {
    pub fn new(vocab: &Vocabulary) -> Self {
        let bl = ByteLevel::new();
        let mut id_of: HashMap<&str, u32> = HashMap::new();
        for (id, (text, &ty)) in vocab.tokens.iter().zip(&vocab.token_types).enumerate() {
            if ty == TOKEN_TYPE_NORMAL {
                assert!(
                    id_of.insert(text, id as u32).is_none(),
                    "duplicate {text:?}"
                );
            }
        }
        let mut byte_ids = [u32::MAX; 256];
        for b in 0..=255u8 {
            byte_ids[b as usize] = id_of[bl.encode(&[b]).as_str()];
        }
        let mut merges = HashMap::new();
        for (rank, m) in vocab.merges.iter().enumerate() {
            let (l, r) = m.split_once(' ').expect("merge has a space");
            assert!(!r.contains(' '), "merge {m:?} has more than one space");
            let joined = format!("{l}{r}");
            let key = (id_of[l], id_of[r]);
            let prev = merges.insert(key, (rank, id_of[joined.as_str()]));
            assert!(prev.is_none(), "duplicate merge {m:?}");
        }
        Self { byte_ids, merges }
    }

    pub fn encode(&self, bytes: &[u8]) -> Vec<u32> {
        let mut ids: Vec<u32> = bytes.iter().map(|&b| self.byte_ids[b as usize]).collect();
        loop {
            let best = ids
                .windows(2)
                .enumerate()
                .filter_map(|(i, w)| {
                    self.merges
                        .get(&(w[0], w[1]))
                        .map(|&(rank, id)| (rank, i, id))
                })
                .min();
            let Some((_, i, id)) = best else { return ids };
            ids[i] = id;
            ids.remove(i + 1);
        }
    }
}
