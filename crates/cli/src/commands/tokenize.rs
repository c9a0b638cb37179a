use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use redlite_engine::tokenizer::Tokenizer;
use redlite_gguf::GgufModel;

use crate::default_model;

#[derive(Args)]
pub struct TokenizeArgs {
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    #[arg(short = 'p', long = "prompt")]
    prompt: String,
    /// Treat special-token text (e.g. `<|im_start|>`) as plain text.
    #[arg(long)]
    no_parse_special: bool,
    /// Only the ids, as a list.
    #[arg(long)]
    ids: bool,
    /// JSON: ids and pieces.
    #[arg(long)]
    json: bool,
}

pub fn run(args: TokenizeArgs) -> Result<()> {
    let path = match args.model {
        Some(p) => p,
        None => default_model::path_or_create()?,
    };
    let gguf = GgufModel::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let tokenizer = Tokenizer::from_metadata(gguf.metadata())?;
    let ids = tokenizer.encode(&args.prompt, !args.no_parse_special)?;
    if args.ids {
        println!("{ids:?}");
        return Ok(());
    }
    let pieces: Vec<String> = ids
        .iter()
        .map(|&id| {
            tokenizer
                .token_piece(id)
                .map(|b| String::from_utf8_lossy(b).into_owned())
        })
        .collect::<Result<_, _>>()?;
    if args.json {
        let rows: Vec<serde_json::Value> = ids
            .iter()
            .zip(&pieces)
            .map(|(id, piece)| serde_json::json!({"id": id, "piece": piece}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            println!("{id:>7} -> {piece:?}");
        }
    }
    Ok(())
}
