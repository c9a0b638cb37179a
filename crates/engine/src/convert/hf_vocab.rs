//! `tokenizer.json` (+ `tokenizer_config.json`, `chat_template.jinja`, `config.json`) of a
//! Hugging Face checkpoint → the GGUF `tokenizer.*` keys, as llama.cpp's converter writes
//! them for a byte-level BPE (`gpt2`) vocabulary with the Qwen2 pre-tokenizer: one string per
//! id up to the model's vocab_size, `[PAD{id}]` for ids no token has; added tokens CONTROL
//! when special or shaped like a control token, USER_DEFINED otherwise; merges as `"A B"`.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::error::{EngineError, Result};
use crate::vocab::{
    Vocabulary, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_UNUSED, TOKEN_TYPE_USER_DEFINED,
};

use super::read_json;

fn bad(what: String) -> EngineError {
    EngineError::Convert(what)
}

/// llama.cpp's converter also makes CONTROL the added tokens that look like control tokens
/// although the tokenizer does not mark them special (Qwen's `<|fim_prefix|>` ...).
fn looks_special(text: &str) -> bool {
    matches!(text, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (text.starts_with("<|") && text.ends_with("|>"))
        || (text.starts_with("<\u{ff5c}") && text.ends_with("\u{ff5c}>"))
        || (text.starts_with("<unused") && text.ends_with('>'))
}

/// The merges of a BPE model: `["a b", ...]` or `[["a", "b"], ...]`.
fn merges(model: &Value) -> Result<Vec<String>> {
    let list = model
        .get("merges")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("tokenizer.json has no model.merges".into()))?;
    list.iter()
        .map(|m| match m {
            Value::String(s) => Ok(s.clone()),
            Value::Array(pair) => match (pair.first(), pair.get(1)) {
                (Some(Value::String(a)), Some(Value::String(b))) if pair.len() == 2 => {
                    Ok(format!("{a} {b}"))
                }
                _ => Err(bad(format!(
                    "tokenizer.json merge {m} is not a pair of strings"
                ))),
            },
            _ => Err(bad(format!(
                "tokenizer.json merge {m} is neither a string nor a pair"
            ))),
        })
        .collect()
}

/// The id of a special token named in tokenizer_config.json (a string or `{"content": ..}`).
fn named_id(config: &Value, key: &str, ids: &HashMap<String, u32>) -> Option<u32> {
    let entry = config.get(key)?;
    let text = entry
        .as_str()
        .or_else(|| entry.get("content").and_then(Value::as_str))?;
    ids.get(text).copied()
}

fn id_field(json: &Value, key: &str) -> Option<u32> {
    json.get(key)?.as_u64().and_then(|v| u32::try_from(v).ok())
}

/// Builds the vocabulary of the checkpoint in `dir` for a model of `vocab_size` rows.
pub fn vocabulary(dir: &Path, model_config: &Value, vocab_size: usize) -> Result<Vocabulary> {
    let tokenizer = read_json(&dir.join("tokenizer.json"))?;
    let model = tokenizer
        .get("model")
        .ok_or_else(|| bad("tokenizer.json has no model".into()))?;
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err(bad(
            "tokenizer.json: only BPE (byte-level) models convert".into()
        ));
    }
    let mut tokens: Vec<Option<String>> = vec![None; vocab_size];
    let mut types = vec![TOKEN_TYPE_UNUSED; vocab_size];
    let mut ids = HashMap::new();
    let mut put = |id: u64, text: &str, ty: i32| -> Result<()> {
        let slot = usize::try_from(id)
            .ok()
            .filter(|&i| i < vocab_size)
            .ok_or_else(|| {
                bad(format!(
                    "token {text:?} has id {id}, past the model's vocab_size {vocab_size}"
                ))
            })?;
        tokens[slot] = Some(text.to_string());
        types[slot] = ty;
        ids.insert(text.to_string(), slot as u32);
        Ok(())
    };
    let vocab = model
        .get("vocab")
        .and_then(Value::as_object)
        .ok_or_else(|| bad("tokenizer.json has no model.vocab".into()))?;
    for (text, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad(format!("tokenizer.json: token {text:?} has no integer id")))?;
        put(id, text, TOKEN_TYPE_NORMAL)?;
    }
    for added in tokenizer
        .get("added_tokens")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let (Some(id), Some(text)) = (
            added.get("id").and_then(Value::as_u64),
            added.get("content").and_then(Value::as_str),
        ) else {
            return Err(bad(format!(
                "tokenizer.json added token {added} lacks id or content"
            )));
        };
        let special = added
            .get("special")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let ty = if special || looks_special(text) {
            TOKEN_TYPE_CONTROL
        } else {
            TOKEN_TYPE_USER_DEFINED
        };
        put(id, text, ty)?;
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.unwrap_or_else(|| format!("[PAD{i}]")))
        .collect();

    let config_path = dir.join("tokenizer_config.json");
    let tok_config = if config_path.exists() {
        read_json(&config_path)?
    } else {
        Value::Null
    };
    let template_path = dir.join("chat_template.jinja");
    let chat_template = if template_path.exists() {
        std::fs::read_to_string(&template_path).map_err(|source| EngineError::Io {
            path: template_path.clone(),
            source,
        })?
    } else {
        tok_config
            .get("chat_template")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let eos = named_id(&tok_config, "eos_token", &ids)
        .or_else(|| id_field(model_config, "eos_token_id"))
        .ok_or_else(|| bad("no end-of-sequence token (tokenizer_config eos_token)".into()))?;
    let bos =
        id_field(model_config, "bos_token_id").or_else(|| named_id(&tok_config, "bos_token", &ids));
    let pad = named_id(&tok_config, "pad_token", &ids)
        .or(bos)
        .unwrap_or(eos);
    let add_bos = tok_config
        .get("add_bos_token")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Vocabulary {
        model: "gpt2".into(),
        pre: "qwen2".into(),
        tokens,
        token_types: types,
        merges: merges(model)?,
        eos_token_id: eos,
        padding_token_id: pad,
        bos_token_id: bos,
        add_bos_token: add_bos,
        chat_template,
    })
}
