//! `redlite serve`: the OpenAI-compatible server on loopback (or `--host`).

use std::io::IsTerminal;
use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use redlite_engine::backend::cpu::CpuBackend;
use redlite_engine::chat::ChatTemplate;
use redlite_engine::serve::{self, Handle, ServeConfig};
use redlite_server::{AppState, DEFAULT_MAX_BODY_BYTES};

use crate::loader::{open, report_loaded, ModelArgs, Opened};

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to bind (loopback by default; 0.0.0.0 exposes the server to the network).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests served at once, each with its own KV cache (`--ctx` positions) and state.
    #[arg(long, default_value_t = 4)]
    slots: usize,
    /// Requests that may wait for a slot; more get 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// State snapshots each slot keeps for prompt reuse.
    #[arg(long, default_value_t = 4)]
    snapshots: usize,
    /// Require `Authorization: Bearer KEY` on /v1/* (also read from REDLITE_API_KEY).
    #[arg(long, env = "REDLITE_API_KEY")]
    api_key: Option<String>,
    /// Largest request body accepted.
    #[arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
    /// Model id listed by /v1/models (default: the file name without extension).
    #[arg(long)]
    alias: Option<String>,
}

/// Starts the scheduler on the device asked for (the CPU when the GPU cannot be used).
fn start_scheduler(
    opened: &Opened,
    args: &ModelArgs,
    config: ServeConfig,
) -> Result<(Handle, &'static str)> {
    let tokenizer = opened.tokenizer.clone();
    let mtp = config.draft > 0;
    let cpu = || {
        // Batch-invariant text: every token takes the one-token kernels' order of sums,
        // whatever it is batched with (the prompt tile kernels sum in another order).
        redlite_quant::disable_tiles();
        let (gguf, model) = (opened.gguf.clone(), opened.config.clone());
        serve::spawn(
            move || {
                let mut backend = CpuBackend::new(gguf, model)?;
                if mtp {
                    backend.load_mtp()?;
                }
                Ok(backend)
            },
            tokenizer.clone(),
            config.clone(),
        )
    };
    match args.device.as_str() {
        "cpu" => Ok((cpu()?, "cpu")),
        #[cfg(feature = "cuda")]
        "cuda" => {
            let (gguf, model, choice) = (opened.gguf.clone(), opened.config.clone(), opened.gpu);
            let gpu = serve::spawn(
                move || {
                    crate::loader::cuda_backend(&gguf, model, choice, mtp)
                        .map_err(|e| redlite_engine::EngineError::Cuda(format!("{e:#}")))
                },
                tokenizer.clone(),
                config.clone(),
            );
            match gpu {
                Ok(h) => Ok((h, "cuda")),
                Err(e) => {
                    eprintln!("CUDA unavailable ({e}); running on the CPU");
                    Ok((cpu()?, "cpu"))
                }
            }
        }
        #[cfg(not(feature = "cuda"))]
        "cuda" => bail!("this redlite was built without CUDA: rebuild with `cargo build --release --features cuda`"),
        other => bail!("unknown device {other:?} (expected cpu or cuda)"),
    }
}

pub fn run(args: ServeArgs) -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
    let start = Instant::now();
    let opened = open(&args.model, args.slots)?;
    let template = match opened.gguf.metadata().str("tokenizer.chat_template") {
        Ok(source) => Some(ChatTemplate::new(source).context("compiling the chat template")?),
        Err(_) => {
            eprintln!("note: the model has no chat template; /v1/chat/completions is refused");
            None
        }
    };
    let config = ServeConfig {
        slots: args.slots,
        context: args.model.ctx,
        kv_type: opened.kv_type,
        chunk: args.model.chunk,
        queue_limit: args.queue,
        snapshots_per_slot: args.snapshots,
        draft: args.model.draft(),
    };
    let (handle, device) = start_scheduler(&opened, &args.model, config)?;
    report_loaded(&opened, device, start);
    let model_id = args.alias.clone().unwrap_or_else(|| {
        opened
            .path
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned())
    });
    let state = AppState {
        handle,
        tokenizer: opened.tokenizer.clone(),
        template,
        model_id,
        api_key: args.api_key.clone(),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    eprintln!(
        "serving {} slots x {} positions{}{}",
        args.slots,
        args.model.ctx,
        if args.model.mtp {
            format!(", MTP drafts {} per step", args.model.draft)
        } else {
            String::new()
        },
        if args.api_key.is_some() {
            ", API key required"
        } else {
            ""
        }
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let addr = SocketAddr::new(args.host, args.port);
    runtime
        .block_on(redlite_server::serve(state, addr, args.max_body_bytes))
        .with_context(|| format!("serving on {addr}"))
}
