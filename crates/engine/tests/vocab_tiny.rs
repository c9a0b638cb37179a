//! The tiny test vocabulary: layout, special ids and BPE validity.

mod vocab_support;

use redlite_engine::vocab::{
    tiny_min_vocab_size, tiny_vocabulary, ByteLevel, VocabError, QWEN3_CHAT_TEMPLATE,
    QWEN_ADDED_TOKENS, TINY_MERGE_COUNT, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
};
use vocab_support::MergeBpe;

#[test]
fn tiny_vocab_layout_and_special_ids() {
    let v = tiny_vocabulary(1000).expect("tiny");
    let first_added = 256 + TINY_MERGE_COUNT;
    assert_eq!(tiny_min_vocab_size(), first_added + 26);
    assert_eq!(v.tokens.len(), 1000);
    assert_eq!(v.token_types.len(), 1000);
    assert_eq!(v.merges.len(), TINY_MERGE_COUNT);
    assert_eq!((v.model.as_str(), v.pre.as_str()), ("gpt2", "qwen2"));
    assert_eq!(v.padding_token_id as usize, first_added);
    assert_eq!(v.bos_token_id, Some(first_added as u32));
    assert_eq!(v.eos_token_id as usize, first_added + 2);
    assert_eq!(v.tokens[v.eos_token_id as usize], "<|im_end|>");
    assert_eq!(v.tokens[v.padding_token_id as usize], "<|endoftext|>");
    assert!(!v.add_bos_token);
    assert_eq!(v.chat_template, QWEN3_CHAT_TEMPLATE);
    let bl = ByteLevel::new();
    for b in 0..=255u8 {
        assert_eq!(v.tokens[b as usize], bl.encode(&[b]));
    }
    for (i, (text, special)) in QWEN_ADDED_TOKENS.iter().enumerate() {
        assert_eq!(v.tokens[first_added + i], *text);
        let ty = if *special {
            TOKEN_TYPE_CONTROL
        } else {
            TOKEN_TYPE_USER_DEFINED
        };
        assert_eq!(v.token_types[first_added + i], ty);
    }
    assert!(v.token_types[..first_added]
        .iter()
        .all(|&t| t == TOKEN_TYPE_NORMAL));
    for id in first_added + 26..1000 {
        assert_eq!(v.token_types[id], TOKEN_TYPE_UNUSED);
        assert_eq!(v.tokens[id], format!("[PAD{id}]"));
    }
}

#[test]
fn tiny_vocab_every_merge_builds_its_token_from_earlier_ones() {
    let v = tiny_vocabulary(tiny_min_vocab_size()).expect("tiny");
    for (i, m) in v.merges.iter().enumerate() {
        let (l, r) = m.split_once(' ').expect("space");
        let made = 256 + i;
        assert_eq!(format!("{l}{r}"), v.tokens[made]);
        for part in [l, r] {
            let id = v
                .tokens
                .iter()
                .position(|t| t == part)
                .expect("part is a token");
            assert!(id < made, "merge {i}: part {part:?} (id {id}) is not older");
        }
    }
    let bpe = MergeBpe::new(&v);
    let bl = ByteLevel::new();
    for id in 0..256 + TINY_MERGE_COUNT {
        let bytes = bl.decode(&v.tokens[id]).expect("gpt2");
        assert_eq!(bpe.encode(&bytes), vec![id as u32], "token {id}");
    }
    // Plain English text needs fewer tokens than bytes (the first Qwen merges are common
    // English and code fragments).
    let text = "return this string to the station and the end of it";
    let pieces: usize = text
        .split_inclusive(' ')
        .map(|w| bpe.encode(w.as_bytes()).len())
        .sum();
    assert!(
        pieces < text.len() * 2 / 3,
        "{pieces} tokens for {} bytes",
        text.len()
    );
}

#[test]
fn tiny_vocab_refuses_too_small() {
    let min = tiny_min_vocab_size();
    assert!(tiny_vocabulary(min).is_ok());
    assert!(matches!(
        tiny_vocabulary(min - 1),
        Err(VocabError::VocabTooSmall { minimum, requested, .. }) if minimum == min && requested == min - 1
    ));
}
