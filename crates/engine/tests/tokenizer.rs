//! Tokenizer agreement with llama.cpp: its Qwen2 vocabulary test vectors, and goldens from
//! `llama-tokenize` over the real Qwen vocabulary (scripts/reference/make_tokenizer_goldens.py).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use redlite_engine::tokenizer::{Tokenizer, TokenizerError};
use redlite_engine::vocab::{qwen_vocabulary, Vocabulary, QWEN_BPE_TOKEN_COUNT, QWEN_VOCAB_SIZE};
use redlite_gguf::{Metadata, Value};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn qwen() -> &'static Vocabulary {
    static VOCAB: OnceLock<Vocabulary> = OnceLock::new();
    VOCAB.get_or_init(|| qwen_vocabulary(QWEN_VOCAB_SIZE).expect("qwen vocabulary"))
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_vocabulary(qwen()).expect("tokenizer"))
}

/// llama.cpp's `.inp` / `.out` pair: (input, expected ids).
fn vocab_test_vectors() -> Vec<(String, Vec<u32>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer");
    let inp = std::fs::read_to_string(dir.join("ggml-vocab-qwen2.gguf.inp")).expect("read .inp");
    let out = std::fs::read_to_string(dir.join("ggml-vocab-qwen2.gguf.out")).expect("read .out");
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    assert_eq!(inputs.pop(), Some(""), ".inp ends with a separator");
    let outputs: Vec<Vec<u32>> = out
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().expect("id"))
                .collect()
        })
        .collect();
    assert_eq!(inputs.len(), outputs.len());
    inputs
        .into_iter()
        .map(str::to_string)
        .zip(outputs)
        .collect()
}

fn check_vectors(tok: &Tokenizer) -> usize {
    let vectors = vocab_test_vectors();
    let mut failures = Vec::new();
    for (text, expected) in &vectors {
        let ids = tok.encode(text, false).expect("encode");
        if &ids != expected {
            failures.push(format!("{text:?}: got {ids:?}, llama.cpp {expected:?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} mismatches:\n{}",
        failures.len(),
        failures.join("\n")
    );
    vectors.len()
}

#[test]
fn tokenizer_llama_cpp_test_vectors() {
    assert_eq!(check_vectors(tokenizer()), 46);
}

struct GoldenCase {
    text: String,
    parse_special: bool,
    ids: Vec<u32>,
}

fn golden_cases() -> Vec<GoldenCase> {
    let path = repo_root().join("tests/golden/tokenizer/llama_cpp_qwen2.json");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read goldens")).expect("json");
    json["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|case| GoldenCase {
            text: case["text"].as_str().expect("text").to_string(),
            parse_special: case["parse_special"].as_bool().expect("parse_special"),
            ids: case["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|id| u32::try_from(id.as_u64().expect("id")).expect("u32"))
                .collect(),
        })
        .collect()
}

#[test]
fn tokenizer_llama_cpp_goldens() {
    let tok = tokenizer();
    let cases = golden_cases();
    assert!(cases.len() >= 400, "only {} golden cases", cases.len());
    let mut failures = Vec::new();
    for case in &cases {
        let ids = tok.encode(&case.text, case.parse_special).expect("encode");
        if ids != case.ids {
            failures.push(format!(
                "{:?} (parse_special {}): got {ids:?}, llama.cpp {:?}",
                case.text, case.parse_special, case.ids
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{}/{} mismatches:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn tokenizer_decode_round_trips_and_streams() {
    let tok = tokenizer();
    for case in golden_cases().iter().filter(|c| c.parse_special) {
        let text = tok.decode(&case.ids, true).expect("decode");
        assert_eq!(text, case.text);

        let mut stream = tok.stream_decoder(true);
        let mut streamed = String::new();
        for &id in &case.ids {
            let piece = stream.push(id).expect("push");
            assert!(!piece.contains('\u{fffd}') || case.text.contains('\u{fffd}'));
            streamed.push_str(&piece);
        }
        streamed.push_str(&stream.finish());
        assert_eq!(streamed, case.text);
    }
}

#[test]
fn tokenizer_stream_holds_partial_utf8() {
    let tok = tokenizer();
    // "😀" is 4 bytes; byte-level BPE tokens for it split the bytes.
    let mut stream = tok.stream_decoder(false);
    let byte_ids: Vec<u32> = "😀".bytes().map(|b| byte_token(tok, b)).collect();
    let mut out = String::new();
    for (i, &id) in byte_ids.iter().enumerate() {
        let piece = stream.push(id).expect("push");
        if i + 1 < byte_ids.len() {
            assert_eq!(piece, "", "emitted a partial character");
            assert_eq!(stream.pending_bytes().len(), i + 1);
        }
        out.push_str(&piece);
    }
    assert_eq!(out, "😀");
    // A cut sequence is flushed as U+FFFD at the end.
    let mut stream = tok.stream_decoder(false);
    assert_eq!(stream.push(byte_ids[0]).expect("push"), "");
    assert_eq!(stream.finish(), "\u{fffd}");
    // Control tokens are hidden unless rendered.
    let mut stream = tok.stream_decoder(false);
    assert_eq!(stream.push(151645).expect("push"), "");
    let mut stream = tok.stream_decoder(true);
    assert_eq!(stream.push(151645).expect("push"), "<|im_end|>");
}

/// The id of the single-byte token for `byte`.
fn byte_token(tok: &Tokenizer, byte: u8) -> u32 {
    (0..QWEN_BPE_TOKEN_COUNT as u32)
        .find(|&id| tok.token_piece(id).expect("piece") == [byte])
        .expect("byte token")
}

#[test]
fn tokenizer_special_tokens_and_eog() {
    let tok = tokenizer();
    assert_eq!(tok.eog_ids(), &[151643, 151645, 151662, 151663, 151664]);
    assert_eq!(tok.eos_token_id(), Some(151645));
    assert!(tok.is_eog(151645) && !tok.is_eog(151644));
    assert_eq!(
        tok.encode("<|im_start|>", true).expect("encode"),
        vec![151644]
    );
    assert_ne!(
        tok.encode("<|im_start|>", false).expect("encode"),
        vec![151644]
    );
    // User-defined added tokens are matched even without parse_special...
    assert_eq!(tok.encode("<think>", false).expect("encode"), vec![151667]);
    // ...except the FIM ones llama.cpp turns into control tokens.
    assert_ne!(
        tok.encode("<|fim_pad|>", false).expect("encode"),
        vec![151662]
    );
    assert_eq!(tok.token_piece(151667).expect("piece"), b"<think>");
    assert_eq!(tok.token_piece(151900).expect("piece"), b"");
    assert_eq!(tok.decode(&[151644, 9707], false).expect("decode"), "Hello");
    assert_eq!(
        tok.decode(&[151644, 9707], true).expect("decode"),
        "<|im_start|>Hello"
    );
    assert!(matches!(
        tok.token_piece(QWEN_VOCAB_SIZE as u32),
        Err(TokenizerError::TokenOutOfRange { .. })
    ));
    assert!(tok.encode("", true).expect("encode").is_empty());
}

fn metadata_of(v: &Vocabulary) -> Metadata {
    let mut md = Metadata::new();
    md.set("tokenizer.ggml.model", Value::String(v.model.clone()));
    md.set("tokenizer.ggml.pre", Value::String(v.pre.clone()));
    md.set("tokenizer.ggml.tokens", Value::strings(v.tokens.clone()));
    md.set(
        "tokenizer.ggml.token_type",
        Value::i32s(v.token_types.clone()),
    );
    md.set("tokenizer.ggml.merges", Value::strings(v.merges.clone()));
    md.set("tokenizer.ggml.eos_token_id", Value::U32(v.eos_token_id));
    md
}

#[test]
fn tokenizer_from_metadata_and_refusals() {
    let tiny = redlite_engine::vocab::tiny_vocabulary(600).expect("tiny vocabulary");
    let md = metadata_of(&tiny);
    let tok = Tokenizer::from_metadata(&md).expect("from metadata");
    assert_eq!(tok.vocab_size(), 600);
    let ids = tok.encode("hello <|im_end|>", true).expect("encode");
    assert_eq!(tok.decode(&ids, true).expect("decode"), "hello <|im_end|>");

    let mut bad = md.clone();
    bad.set("tokenizer.ggml.pre", Value::String("llama-bpe".into()));
    match Tokenizer::from_metadata(&bad) {
        Err(TokenizerError::UnsupportedPre { found }) => assert_eq!(found, "llama-bpe"),
        other => panic!("expected UnsupportedPre, got {other:?}"),
    }
    let mut bad = md.clone();
    bad.set("tokenizer.ggml.model", Value::String("llama".into()));
    assert!(matches!(
        Tokenizer::from_metadata(&bad),
        Err(TokenizerError::UnsupportedModel { .. })
    ));
    let mut bad = md.clone();
    bad.remove("tokenizer.ggml.merges");
    assert!(matches!(
        Tokenizer::from_metadata(&bad),
        Err(TokenizerError::MissingKey {
            key: "tokenizer.ggml.merges"
        })
    ));
    let mut bad = md;
    bad.set("tokenizer.ggml.eos_token_id", Value::U32(600));
    assert!(matches!(
        Tokenizer::from_metadata(&bad),
        Err(TokenizerError::SpecialIdOutOfRange { .. })
    ));
}

/// llama.cpp's own vocabulary file (not committed: 5.9 MB) holds the same BPE tokens as ours,
/// and a tokenizer built from its metadata passes the same vectors.
#[test]
fn tokenizer_llama_cpp_vocab_file_matches_ours() {
    let path = repo_root().join(
        ".cache/reference/llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-qwen2.gguf",
    );
    if !path.exists() {
        eprintln!("skipped: {} not present", path.display());
        return;
    }
    let model = redlite_gguf::GgufModel::open(&path).expect("open vocab gguf");
    let md = model.metadata();
    let theirs = md
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_array)
        .expect("tokens");
    let ours = &qwen().tokens;
    for (id, (a, b)) in theirs
        .iter()
        .zip(ours)
        .take(QWEN_BPE_TOKEN_COUNT)
        .enumerate()
    {
        assert_eq!(a.as_str(), Some(b.as_str()), "token {id}");
    }
    assert!(theirs.len() >= QWEN_BPE_TOKEN_COUNT);
    let tok = Tokenizer::from_metadata(md).expect("tokenizer from llama.cpp's file");
    assert_eq!(check_vectors(&tok), 46);
}
