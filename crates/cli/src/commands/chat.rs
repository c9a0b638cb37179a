//! `redlite chat`: a multi-turn conversation through the model's chat template. The
//! session keeps its state between turns and is fed only the tokens it has not seen when
//! the new rendering extends the old one (DeltaNet state cannot be rewound otherwise).

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use redlite_engine::chat::{ChatMessage, ChatTemplate, RenderOptions};
use redlite_engine::generate::{generate, GenerateRequest, StopReason};

use crate::commands::sampling_args::SamplingArgs;
use crate::loader::{load, Loaded, ModelArgs};

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    /// System prompt.
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    n_predict: usize,
}

struct Conversation {
    system: Option<String>,
    messages: Vec<ChatMessage>,
    /// Tokens the session has processed, in order.
    fed: Vec<u32>,
}

impl Conversation {
    fn rendered(&self) -> Vec<ChatMessage> {
        let mut all = Vec::new();
        if let Some(s) = &self.system {
            all.push(ChatMessage::new("system", s.clone()));
        }
        all.extend(self.messages.iter().cloned());
        all
    }
}

pub fn run(args: ChatArgs) -> Result<()> {
    let mut loaded = load(&args.model)?;
    let source = loaded
        .gguf
        .metadata()
        .str("tokenizer.chat_template")
        .context("the model has no chat template")?
        .to_string();
    let template = ChatTemplate::new(&source)?;
    let cancel = Arc::new(AtomicBool::new(false));
    {
        let cancel = cancel.clone();
        ctrlc::set_handler(move || cancel.store(true, Ordering::SeqCst))
            .context("installing the Ctrl-C handler")?;
    }
    let mut conv = Conversation {
        system: args.system.clone(),
        messages: Vec::new(),
        fed: Vec::new(),
    };
    eprintln!("commands: /reset (new conversation), /system TEXT, /exit; Ctrl-C stops an answer");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim_end();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                conv.messages.clear();
                conv.fed.clear();
                loaded.session.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        if let Some(system) = line.strip_prefix("/system") {
            conv.system = Some(system.trim().to_string());
            conv.messages.clear();
            conv.fed.clear();
            loaded.session.reset();
            eprintln!("(system prompt set; conversation reset)");
            continue;
        }
        conv.messages.push(ChatMessage::new("user", line));
        cancel.store(false, Ordering::SeqCst);
        let answer = answer(&mut loaded, &template, &mut conv, &args, &cancel)?;
        conv.messages.push(ChatMessage::new("assistant", answer));
    }
    Ok(())
}

fn answer(
    loaded: &mut Loaded,
    template: &ChatTemplate,
    conv: &mut Conversation,
    args: &ChatArgs,
    cancel: &AtomicBool,
) -> Result<String> {
    let options = RenderOptions {
        add_generation_prompt: true,
        ..RenderOptions::default()
    };
    let text = template.render(&conv.rendered(), &options)?;
    let tokens = loaded.tokenizer.encode(&text, true)?;
    // Reuse the state when the new prompt extends what was fed; else start over.
    let new = if tokens.starts_with(&conv.fed) && tokens.len() > conv.fed.len() {
        tokens[conv.fed.len()..].to_vec()
    } else {
        loaded.session.reset();
        tokens.clone()
    };
    let request = GenerateRequest {
        prompt: new,
        max_tokens: args.n_predict,
        sampling: args.sampling.params(),
        stop: args.sampling.stop.clone(),
        render_special: false,
        draft: args.model.draft(),
    };
    let mut reply = String::new();
    let mut stdout = std::io::stdout();
    let stats = generate(
        loaded.session.as_mut(),
        &loaded.tokenizer,
        &request,
        &mut |piece| {
            reply.push_str(piece);
            print!("{piece}");
            let _ = stdout.flush();
            !cancel.load(Ordering::SeqCst)
        },
    )?;
    println!();
    // The token that ended the answer (the length limit, an end-of-turn token) was emitted
    // but never fed: the session's position says how many were.
    conv.fed = tokens;
    conv.fed.extend_from_slice(&stats.generated);
    conv.fed.truncate(loaded.session.pos());
    if stats.stop == StopReason::Cancelled {
        eprintln!("(stopped)");
    }
    eprintln!(
        "[prompt {} new tokens at {:.1} tok/s, {} tokens at {:.1} tok/s]",
        stats.prompt_tokens,
        stats.prefill_tokens_per_second(),
        stats.generated.len(),
        stats.decode_tokens_per_second()
    );
    if let Some(m) = &stats.mtp {
        eprintln!(
            "[mtp: drafted {}, accepted {} ({:.1} %), mean accepted length {:.2}]",
            m.drafted,
            m.accepted,
            100.0 * m.acceptance_rate(),
            m.mean_accepted()
        );
    }
    Ok(reply)
}
