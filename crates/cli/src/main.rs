//! `redlite`: run, inspect and build Qwen3-Next (qwen3next) GGUF models.

mod commands;
mod default_model;
mod loader;
mod profile;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "redlite",
    version,
    about = "Inference engine for Qwen3-Next GGUF models"
)]
struct Cli {
    /// Worker threads (default: all cores).
    #[arg(long, global = true)]
    threads: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a GGUF file holds (split files too) and what the engine will use.
    Inspect(commands::inspect::InspectArgs),
    /// Write a qwen3next GGUF with the real tensor names, shapes and types, filled with
    /// seeded random data.
    Synth(Box<commands::synth::SynthArgs>),
    /// Convert a Hugging Face Qwen3-Next checkpoint (safetensors) to a GGUF.
    Convert(commands::convert::ConvertArgs),
    /// Generate text from a prompt, streaming it.
    Generate(Box<commands::generate::GenerateArgs>),
    /// Chat with the model (multi-turn, through its chat template).
    Chat(Box<commands::chat::ChatArgs>),
    /// Time prompt processing and generation (llama-bench's tests; --json for scripts).
    Bench(Box<commands::bench::BenchArgs>),
    /// Perplexity of a text file (llama-perplexity's procedure: chunks of --ctx, second
    /// halves scored).
    Perplexity(Box<commands::quality::PerplexityArgs>),
    /// KL divergence of the model's next-token distributions from a base model's.
    Kld(Box<commands::quality::KldArgs>),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve(Box<commands::serve::ServeArgs>),
    /// Print the token ids (and pieces) of a text.
    Tokenize(commands::tokenize::TokenizeArgs),
    /// How a model would use a GPU of a given size (metadata only), and whether it fits.
    Plan(Box<commands::plan::PlanArgs>),
    /// Write the logits of every position of a token sequence (for parity tools).
    Logits(commands::logits::LogitsArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    if let Some(n) = cli.threads {
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()?;
    }
    match cli.command {
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Synth(args) => commands::synth::run(*args),
        Command::Convert(args) => commands::convert::run(args),
        Command::Logits(args) => commands::logits::run(args),
        Command::Plan(args) => commands::plan::run(*args),
        Command::Generate(args) => commands::generate::run(*args),
        Command::Chat(args) => commands::chat::run(*args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Bench(args) => commands::bench::run(*args),
        Command::Serve(args) => commands::serve::run(*args),
        Command::Perplexity(args) => commands::quality::run_perplexity(*args),
        Command::Kld(args) => commands::quality::run_kld(*args),
    }
}
