use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::model::load::config_from_gguf;
use redlite_engine::session::{Session, DEFAULT_CHUNK};
use redlite_engine::state::KvType;
use redlite_gguf::GgufModel;

use crate::default_model;

#[derive(Args)]
pub struct LogitsArgs {
    /// GGUF file (default: the default model).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Comma-separated token ids.
    #[arg(long, value_delimiter = ',', required = true)]
    tokens: Vec<u32>,
    /// Output file: f32 little-endian, positions × vocab. Default: a summary on stdout.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Prefill chunk size.
    #[arg(long, default_value_t = DEFAULT_CHUNK)]
    chunk: usize,
    /// KV cache type: f32 or f16.
    #[arg(long, default_value = "f32")]
    kv: String,
    /// Also write the residual stream after each layer to this file
    /// (f32 LE, [layers + 1][positions][n_embd]).
    #[arg(long)]
    hidden_out: Option<PathBuf>,
}

pub fn run(args: LogitsArgs) -> Result<()> {
    let path = match args.model {
        Some(p) => p,
        None => default_model::path_or_create()?,
    };
    let Some(kv_type) = KvType::parse(&args.kv) else {
        bail!("unknown KV type {:?} (expected f32 or f16)", args.kv)
    };
    let gguf =
        Arc::new(GgufModel::open(&path).with_context(|| format!("opening {}", path.display()))?);
    let config = config_from_gguf(&gguf)?;
    let backend = CpuBackend::new(gguf, config)?;
    let mut session = Session::new(backend, args.tokens.len(), kv_type, args.chunk)?;
    let out = session.feed(&args.tokens, true, args.hidden_out.is_some())?;
    let vocab = session.n_vocab();
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
        let all: Vec<f32> = out.hidden.concat();
        write_f32(&file, &all)?;
    }
    Ok(())
}

fn write_f32(path: &PathBuf, values: &[f32]) -> Result<()> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for v in values {
        f.write_all(&v.to_le_bytes())?;
    }
    f.flush()?;
    Ok(())
}
