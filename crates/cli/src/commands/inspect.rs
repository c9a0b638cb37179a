use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use redlite_engine::inspect::inspect;
use redlite_gguf::GgufModel;

use crate::default_model;

#[derive(Args)]
pub struct InspectArgs {
    /// GGUF file (any part of a split set). Without it: the default model.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// Also accepted as -m, like the other commands.
    #[arg(short = 'm', long = "model", conflicts_with = "file")]
    model: Option<PathBuf>,
    /// Context length for the memory estimate.
    #[arg(long, default_value_t = 32768)]
    ctx: u64,
    /// Print JSON for scripts.
    #[arg(long)]
    json: bool,
}

pub fn run(args: InspectArgs) -> Result<()> {
    let path = match args.file.or(args.model) {
        Some(p) => p,
        None => default_model::path_or_create()?,
    };
    let model = GgufModel::open(&path).with_context(|| format!("opening {}", path.display()))?;
    let report = inspect(&model, args.ctx);
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&report)?)
    } else {
        report.to_string()
    };
    // A reader that stops early (`| head`) is not an error.
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
