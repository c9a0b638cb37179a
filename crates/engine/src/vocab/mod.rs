//! Qwen2/Qwen3 vocabularies as the GGUF `tokenizer.ggml.*` arrays, for synthetic model files.
//!
//! Two builders:
//! * [`qwen_vocabulary`]: the real 151,643-rank byte-level BPE vocabulary (embedded
//!   `assets/vocab/qwen.tiktoken.gz`), its 151,387 merges derived from the ranks, the 26
//!   Qwen3 added tokens at ids 151643..=151668, and `[PAD{i}]` filler up to the model's
//!   embedding rows (151,936 for Qwen3-Next).
//! * [`tiny_vocabulary`]: the 256 byte tokens plus the first [`TINY_MERGE_COUNT`] merges of
//!   the real vocabulary and the same 26 added tokens, for small test models.
//!
//! Token strings use the GPT-2 byte-to-unicode mapping (`tokenizer.ggml.model = "gpt2"`), so
//! every token is a valid UTF-8 string whatever its bytes are.

mod byte_level;
mod qwen;
mod ranks;
mod tiny;

pub use byte_level::ByteLevel;
pub use qwen::{
    qwen_vocabulary, QWEN_ADDED_TOKEN_COUNT, QWEN_BPE_TOKEN_COUNT, QWEN_FIRST_ADDED_ID,
    QWEN_MERGE_COUNT, QWEN_VOCAB_SIZE,
};
pub use tiny::{tiny_min_vocab_size, tiny_vocabulary, TINY_MERGE_COUNT};

/// `tokenizer.ggml.token_type` value of an ordinary BPE token.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// `tokenizer.ggml.token_type` value of a control (special) token, never produced by BPE.
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// `tokenizer.ggml.token_type` value of an added token that is not special (it is still matched
/// verbatim in text, and rendered when decoding).
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
/// `tokenizer.ggml.token_type` value of a filler row that no text maps to.
pub const TOKEN_TYPE_UNUSED: i32 = 5;

/// Qwen3's chat template (from Qwen/Qwen3-0.6B, as vendored by llama.cpp), stored verbatim.
pub const QWEN3_CHAT_TEMPLATE: &str = include_str!("../../../../assets/chat/Qwen-Qwen3-0.6B.jinja");
/// Qwen3-Coder's chat template (XML-style tool calls), as vendored by llama.cpp.
pub const QWEN3_CODER_CHAT_TEMPLATE: &str =
    include_str!("../../../../assets/chat/Qwen3-Coder.jinja");

/// The 26 added tokens of Qwen2.5/Qwen3, in id order, with whether the tokenizer config marks
/// each one "special" (then its GGUF type is control, otherwise user-defined).
pub const QWEN_ADDED_TOKENS: [(&str, bool); 26] = [
    ("<|endoftext|>", true),
    ("<|im_start|>", true),
    ("<|im_end|>", true),
    ("<|object_ref_start|>", true),
    ("<|object_ref_end|>", true),
    ("<|box_start|>", true),
    ("<|box_end|>", true),
    ("<|quad_start|>", true),
    ("<|quad_end|>", true),
    ("<|vision_start|>", true),
    ("<|vision_end|>", true),
    ("<|vision_pad|>", true),
    ("<|image_pad|>", true),
    ("<|video_pad|>", true),
    ("<tool_call>", false),
    ("</tool_call>", false),
    ("<|fim_prefix|>", false),
    ("<|fim_middle|>", false),
    ("<|fim_suffix|>", false),
    ("<|fim_pad|>", false),
    ("<|repo_name|>", false),
    ("<|file_sep|>", false),
    ("<tool_response>", false),
    ("</tool_response>", false),
    ("<think>", false),
    ("</think>", false),
];

/// Offsets inside [`QWEN_ADDED_TOKENS`] of the tokens the GGUF metadata points at.
const ADDED_ENDOFTEXT: usize = 0;
const ADDED_IM_END: usize = 2;

/// A tokenizer vocabulary in the shape of the GGUF `tokenizer.*` metadata keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vocabulary {
    /// `tokenizer.ggml.model`: always `"gpt2"` (byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: always `"qwen2"` (the Qwen2/Qwen3 pre-tokenizer regex).
    pub pre: String,
    /// `tokenizer.ggml.tokens`: one string per token id, GPT-2 byte-to-unicode encoded for BPE
    /// tokens, verbatim for added tokens, `[PAD{id}]` for filler rows.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`: one `TOKEN_TYPE_*` value per token id.
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"A B"` pairs (GPT-2 strings, one space), rank = index.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.eos_token_id`: the `<|im_end|>` token.
    pub eos_token_id: u32,
    /// `tokenizer.ggml.padding_token_id`: the `<|endoftext|>` token.
    pub padding_token_id: u32,
    /// `tokenizer.ggml.bos_token_id`: the `<|endoftext|>` token (written, but never prepended).
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: false for Qwen.
    pub add_bos_token: bool,
    /// `tokenizer.chat_template`: Qwen3's Jinja template.
    pub chat_template: String,
}

/// Why a vocabulary could not be built.
#[derive(Debug, thiserror::Error)]
pub enum VocabError {
    #[error("vocab: decompressing the embedded qwen.tiktoken failed: {0}")]
    Decompress(#[from] std::io::Error),
    #[error("vocab: qwen.tiktoken line {line}: {reason}")]
    MalformedRank { line: usize, reason: String },
    #[error("vocab: qwen.tiktoken has {found} ranks, expected {expected}")]
    RankCount { expected: usize, found: usize },
    #[error("vocab: token of rank {rank} cannot be built from two lower-ranked tokens (left {parts} parts)")]
    NoMergePath { rank: u32, parts: usize },
    #[error("vocab: ranks {first} and {second} hold the same bytes")]
    DuplicateToken { first: u32, second: u32 },
    #[error("vocab: derived {found} merges, expected {expected}")]
    MergeCount { expected: usize, found: usize },
    #[error("vocab: {builder} vocabulary needs vocab_size >= {minimum}, got {requested}")]
    VocabTooSmall {
        builder: &'static str,
        minimum: usize,
        requested: usize,
    },
    #[error("vocab: token id {id} does not fit in u32")]
    IdOverflow { id: usize },
}

/// Appends the 26 added tokens and the `[PAD{id}]` filler, then fills in the special ids.
/// `tokens`, `token_types` and `merges` hold the BPE part on entry.
fn finish_vocabulary(
    builder: &'static str,
    mut tokens: Vec<String>,
    mut token_types: Vec<i32>,
    merges: Vec<String>,
    vocab_size: usize,
) -> Result<Vocabulary, VocabError> {
    let first_added = tokens.len();
    let minimum = first_added + QWEN_ADDED_TOKENS.len();
    if vocab_size < minimum {
        return Err(VocabError::VocabTooSmall {
            builder,
            minimum,
            requested: vocab_size,
        });
    }
    let id_of = |offset: usize| -> Result<u32, VocabError> {
        let id = first_added + offset;
        u32::try_from(id).map_err(|_| VocabError::IdOverflow { id })
    };
    let endoftext = id_of(ADDED_ENDOFTEXT)?;
    let im_end = id_of(ADDED_IM_END)?;
    // Last id must fit too: GGUF token ids are u32.
    id_of(vocab_size - 1 - first_added)?;

    tokens.reserve(vocab_size - first_added);
    token_types.reserve(vocab_size - first_added);
    for (text, special) in QWEN_ADDED_TOKENS {
        tokens.push(text.to_string());
        token_types.push(if special {
            TOKEN_TYPE_CONTROL
        } else {
            TOKEN_TYPE_USER_DEFINED
        });
    }
    for id in tokens.len()..vocab_size {
        tokens.push(format!("[PAD{id}]"));
        token_types.push(TOKEN_TYPE_UNUSED);
    }
    Ok(Vocabulary {
        model: "gpt2".to_string(),
        pre: "qwen2".to_string(),
        tokens,
        token_types,
        merges,
        eos_token_id: im_end,
        padding_token_id: endoftext,
        bos_token_id: Some(endoftext),
        add_bos_token: false,
        chat_template: QWEN3_CHAT_TEMPLATE.to_string(),
    })
}
