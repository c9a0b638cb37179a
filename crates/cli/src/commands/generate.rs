use std::io::Write;

use anyhow::Result;
use clap::Args;
use redlite_engine::chat::{ChatMessage, ChatTemplate, RenderOptions};
use redlite_engine::generate::{generate, GenerateRequest};

use crate::commands::sampling_args::SamplingArgs;
use crate::loader::{load, ModelArgs};
use crate::profile;

#[derive(Args)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// Prompt text.
    #[arg(short = 'p', long = "prompt")]
    prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    n_predict: usize,
    /// Wrap the prompt as one user turn of the model's chat template.
    #[arg(long)]
    chat: bool,
    /// With --device cuda: print where the GPU's time goes per model component, for the
    /// prompt and for the generation (CUDA events; the decode graph is off meanwhile).
    #[arg(long)]
    profile: bool,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    profile::enable(args.profile, &args.model.device)?;
    let mut loaded = load(&args.model)?;
    profile::discard(args.profile)?;
    let text = if args.chat {
        let source = loaded
            .gguf
            .metadata()
            .str("tokenizer.chat_template")?
            .to_string();
        let template = ChatTemplate::new(&source)?;
        let options = RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        };
        template.render(&[ChatMessage::new("user", args.prompt.clone())], &options)?
    } else {
        args.prompt.clone()
    };
    let prompt = loaded.tokenizer.encode(&text, true)?;
    let request = GenerateRequest {
        prompt,
        max_tokens: args.n_predict,
        sampling: args.sampling.params(),
        stop: args.sampling.stop.clone(),
        render_special: false,
        draft: args.model.draft(),
    };
    let mut stdout = std::io::stdout();
    print!("{}", args.prompt);
    let prompt_tokens = request.prompt.len();
    let mut pieces = 0usize;
    let stats = generate(
        loaded.session.as_mut(),
        &loaded.tokenizer,
        &request,
        &mut |piece| {
            // The first piece comes after the prompt's prefill (and the first token's sampling).
            if pieces == 0 {
                if let Err(e) = profile::print(args.profile, "prompt", 1, prompt_tokens) {
                    eprintln!("profile: {e:#}");
                }
            }
            pieces += 1;
            print!("{piece}");
            stdout.flush().is_ok()
        },
    )?;
    println!();
    let decoded = stats.generated.len().saturating_sub(1);
    profile::print(args.profile, "generation", 1, decoded)?;
    eprintln!(
        "prompt {} tokens, {:.1} tok/s; generated {} tokens, {:.1} tok/s; stop: {:?}",
        stats.prompt_tokens,
        stats.prefill_tokens_per_second(),
        stats.generated.len(),
        stats.decode_tokens_per_second(),
        stats.stop
    );
    if let Some(m) = &stats.mtp {
        eprintln!(
            "mtp: {} steps, drafted {}, accepted {} ({:.1} %), mean accepted length {:.2} per step",
            m.steps,
            m.drafted,
            m.accepted,
            100.0 * m.acceptance_rate(),
            m.mean_accepted()
        );
    }
    Ok(())
}
