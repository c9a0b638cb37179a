use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;

use crate::loader::{load, ModelArgs};

#[derive(Args)]
pub struct LogitsArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Output file: f32 little-endian, positions × vocab. Default: a summary on stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Also write the residual stream after the embedding and each layer to this file
    /// (f32 LE, [layers + 1][positions][n_embd]).
    #[arg(long)]
    hidden_out: Option<PathBuf>,
}

pub fn run(mut args: LogitsArgs) -> Result<()> {
    args.model.ctx = args.model.ctx.max(args.tokens.len());
    let mut loaded = load(&args.model)?;
    let out = loaded
        .session
        .feed(&args.tokens, true, args.hidden_out.is_some())?;
    let vocab = loaded.session.n_vocab();
    match args.out {
        Some(file) => write_f32(&file, &out.logits)?,
        None => {
            for (pos, row) in out.logits.chunks(vocab).enumerate() {
                let (best, value) =
                    row.iter()
                        .enumerate()
                        .fold(
                            (0, f32::NEG_INFINITY),
                            |acc, (i, &v)| if v > acc.1 { (i, v) } else { acc },
                        );
                println!(
                    "pos {pos}: argmax {best} ({value:.4}), logits[0..4] = {:?}",
                    &row[..4.min(row.len())]
                );
            }
        }
    }
    if let Some(file) = args.hidden_out {
        write_f32(&file, &out.hidden.concat())?;
    }
    Ok(())
}

fn write_f32(path: &PathBuf, values: &[f32]) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut f = std::io::BufWriter::new(file);
    for v in values {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}
