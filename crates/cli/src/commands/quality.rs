//! `redlite perplexity` and `redlite kld`: llama.cpp's `llama-perplexity` procedure (and its
//! KL-divergence mode), so the figures compare with llama.cpp's on the same file and text.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use redlite_engine::quality::{kl_divergence, perplexity};

use crate::loader::{load, ModelArgs};

#[derive(Args)]
pub struct PerplexityArgs {
    /// `--ctx` is the chunk length (every chunk is evaluated from an empty state).
    #[command(flatten)]
    model: ModelArgs,
    /// The text file to score.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct KldArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The reference model (e.g. the F16 file the quantized one came from).
    #[arg(long)]
    base: PathBuf,
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    #[arg(long)]
    json: bool,
}

fn read_text(path: &PathBuf) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

fn progress(i: usize, value: f64) {
    eprint!("[{}]{value:.4},", i + 1);
    let _ = std::io::stderr().flush();
}

pub fn run_perplexity(args: PerplexityArgs) -> Result<()> {
    let text = read_text(&args.file)?;
    let mut loaded = load(&args.model)?;
    // As llama-perplexity: special-token text in the file is plain text.
    let tokens = loaded.tokenizer.encode(&text, false)?;
    eprintln!("{} tokens, chunks of {}", tokens.len(), args.model.ctx);
    let r = perplexity(
        loaded.session.as_mut(),
        &tokens,
        args.model.ctx,
        &mut progress,
    )?;
    eprintln!();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "file": args.file, "n_ctx": r.n_ctx, "chunks": r.per_chunk.len(),
                "scored_tokens": r.scored_tokens, "ppl": r.ppl, "ppl_error": r.ppl_error,
                "per_chunk": r.per_chunk,
            })
        );
    } else {
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5} ({} chunks of {}, {} tokens scored)",
            r.ppl,
            r.ppl_error,
            r.per_chunk.len(),
            r.n_ctx,
            r.scored_tokens
        );
    }
    Ok(())
}

pub fn run_kld(args: KldArgs) -> Result<()> {
    let text = read_text(&args.file)?;
    let mut model = load(&args.model)?;
    let mut base_args = args.model.clone();
    base_args.model = Some(args.base.clone());
    let mut base = load(&base_args)?;
    let tokens = base.tokenizer.encode(&text, false)?;
    if model.tokenizer.encode(&text, false)? != tokens {
        anyhow::bail!(
            "the two models tokenize the text differently: they do not share a vocabulary"
        );
    }
    let r = kl_divergence(
        base.session.as_mut(),
        model.session.as_mut(),
        &tokens,
        args.model.ctx,
        &mut progress,
    )?;
    eprintln!();
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "scored_tokens": r.scored_tokens, "mean_kld": r.mean_kld, "kld_error": r.kld_error,
                "max_kld": r.max_kld, "same_top1": r.same_top1, "ppl": r.ppl, "base_ppl": r.base_ppl,
            })
        );
    } else {
        println!("Mean    KLD: {:.6} ± {:.6}", r.mean_kld, r.kld_error);
        println!("Maximum KLD: {:.6}", r.max_kld);
        println!("Same top p : {:.3} %", 100.0 * r.same_top1);
        println!("PPL        : {:.4} (base {:.4})", r.ppl, r.base_ppl);
        println!("({} tokens scored)", r.scored_tokens);
    }
    Ok(())
}
