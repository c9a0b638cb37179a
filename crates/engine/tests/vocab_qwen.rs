//! The real Qwen vocabulary against the tiktoken reference fixture
//! (scripts/fixtures/gen_vocab_fixture.py).

mod vocab_support;

use std::collections::HashSet;
use std::sync::OnceLock;
use std::time::Instant;

use redlite_engine::vocab::{
    qwen_vocabulary, tiny_vocabulary, ByteLevel, VocabError, Vocabulary, QWEN3_CHAT_TEMPLATE,
    QWEN_ADDED_TOKENS, QWEN_MERGE_COUNT, QWEN_VOCAB_SIZE, TINY_MERGE_COUNT, TOKEN_TYPE_CONTROL,
    TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED,
};
use vocab_support::{hex_bytes, sha256_hex, MergeBpe};

const FIXTURE: &str = include_str!("fixtures/qwen_vocab_probe.json");

fn vocab() -> &'static Vocabulary {
    static VOCAB: OnceLock<Vocabulary> = OnceLock::new();
    VOCAB.get_or_init(|| {
        let start = Instant::now();
        let v = qwen_vocabulary(QWEN_VOCAB_SIZE).expect("qwen vocabulary");
        eprintln!("qwen_vocabulary built in {:?}", start.elapsed());
        v
    })
}

fn fixture() -> serde_json::Value {
    serde_json::from_str(FIXTURE).expect("fixture json")
}

#[test]
fn qwen_vocab_counts_and_metadata() {
    let v = vocab();
    assert_eq!(v.tokens.len(), 151_936);
    assert_eq!(v.token_types.len(), 151_936);
    assert_eq!(v.merges.len(), 151_387);
    assert_eq!(QWEN_MERGE_COUNT, 151_387);
    assert_eq!(v.model, "gpt2");
    assert_eq!(v.pre, "qwen2");
    assert_eq!(v.eos_token_id, 151_645);
    assert_eq!(v.padding_token_id, 151_643);
    assert_eq!(v.bos_token_id, Some(151_643));
    assert!(!v.add_bos_token);
    assert_eq!(v.chat_template, QWEN3_CHAT_TEMPLATE);
    assert!(v.chat_template.contains("<|im_start|>assistant\\n"));
    assert!(v.chat_template.contains("enable_thinking"));
}

#[test]
fn qwen_vocab_added_tokens_ids_and_types() {
    let v = vocab();
    let expected = [
        (151_643, "<|endoftext|>"),
        (151_644, "<|im_start|>"),
        (151_645, "<|im_end|>"),
        (151_656, "<|video_pad|>"),
        (151_657, "<tool_call>"),
        (151_658, "</tool_call>"),
        (151_659, "<|fim_prefix|>"),
        (151_662, "<|fim_pad|>"),
        (151_663, "<|repo_name|>"),
        (151_664, "<|file_sep|>"),
        (151_665, "<tool_response>"),
        (151_666, "</tool_response>"),
        (151_667, "<think>"),
        (151_668, "</think>"),
    ];
    for (id, text) in expected {
        assert_eq!(v.tokens[id], text, "id {id}");
    }
    for (i, (text, _)) in QWEN_ADDED_TOKENS.iter().enumerate() {
        assert_eq!(v.tokens[151_643 + i], *text);
    }
    for (id, &ty) in v.token_types.iter().enumerate() {
        let want = match id {
            0..=151_642 => TOKEN_TYPE_NORMAL,
            151_643..=151_656 => TOKEN_TYPE_CONTROL,
            151_657..=151_668 => TOKEN_TYPE_USER_DEFINED,
            _ => TOKEN_TYPE_UNUSED,
        };
        assert_eq!(ty, want, "type of id {id}");
        if id >= 151_669 {
            assert_eq!(v.tokens[id], format!("[PAD{id}]"));
        }
    }
}

#[test]
fn qwen_vocab_bpe_tokens_round_trip_and_match_tiktoken() {
    let v = vocab();
    let fx = fixture();
    let bl = ByteLevel::new();
    let mut seen = HashSet::new();
    for (id, text) in v.tokens[..151_643].iter().enumerate() {
        let bytes = bl
            .decode(text)
            .unwrap_or_else(|| panic!("id {id}: {text:?} not GPT-2"));
        assert!(!bytes.is_empty());
        assert_eq!(bl.encode(&bytes), *text);
        assert!(seen.insert(bytes), "id {id} duplicates an earlier token");
    }
    assert_eq!(fx["bpe_token_count"], 151_643);
    assert_eq!(
        sha256_hex(v.tokens[..151_643].join("\n").as_bytes()),
        fx["tokens_sha256"].as_str().expect("tokens_sha256")
    );
    let probes = fx["probes"].as_array().expect("probes");
    assert!(probes.len() >= 30);
    for p in probes {
        let rank = p["rank"].as_u64().expect("rank") as usize;
        let want = hex_bytes(p["hex"].as_str().expect("hex"));
        assert_eq!(bl.decode(&v.tokens[rank]), Some(want), "probe rank {rank}");
        if let Some(merge) = p["merge"].as_str() {
            // The 256 single bytes are ranks 0..256, so merge i creates rank 256 + i.
            assert_eq!(v.merges[rank - 256], merge, "merge of rank {rank}");
        }
    }
}

#[test]
fn qwen_vocab_merges_match_independent_derivation() {
    let v = vocab();
    let fx = fixture();
    assert_eq!(fx["merge_count"], 151_387);
    assert_eq!(
        sha256_hex(v.merges.join("\n").as_bytes()),
        fx["merges_sha256"].as_str().expect("merges_sha256")
    );
    let bl = ByteLevel::new();
    for (i, m) in v.merges.iter().enumerate() {
        let (l, r) = m.split_once(' ').expect("space");
        assert!(
            !l.is_empty() && !r.is_empty() && !r.contains(' '),
            "merge {i}: {m:?}"
        );
        assert_eq!(format!("{l}{r}"), v.tokens[256 + i], "merge {i}");
        assert!(bl.decode(l).is_some() && bl.decode(r).is_some());
    }
}

/// A merge-list BPE (llama.cpp's algorithm) must turn every token's bytes into that token.
#[test]
fn qwen_vocab_merge_list_bpe_reproduces_every_token() {
    let v = vocab();
    let bpe = MergeBpe::new(v);
    let bl = ByteLevel::new();
    for (id, text) in v.tokens[..151_643].iter().enumerate() {
        let bytes = bl.decode(text).expect("gpt2");
        assert_eq!(bpe.encode(&bytes), vec![id as u32], "token {id} {text:?}");
    }
}

#[test]
fn qwen_vocab_tiny_merges_are_a_prefix_of_the_real_ones() {
    let v = vocab();
    let tiny = tiny_vocabulary(1024).expect("tiny");
    assert_eq!(tiny.merges[..], v.merges[..TINY_MERGE_COUNT]);
    assert_eq!(
        tiny.tokens[256..256 + TINY_MERGE_COUNT],
        v.tokens[256..256 + TINY_MERGE_COUNT]
    );
}

#[test]
fn qwen_vocab_exact_minimum_size_and_refusal() {
    let v = qwen_vocabulary(151_669).expect("minimum size");
    assert_eq!(v.tokens.len(), 151_669);
    assert_eq!(v.tokens.last().map(String::as_str), Some("</think>"));
    assert!(matches!(
        qwen_vocabulary(151_668),
        Err(VocabError::VocabTooSmall {
            minimum: 151_669,
            requested: 151_668,
            ..
        })
    ));
}
