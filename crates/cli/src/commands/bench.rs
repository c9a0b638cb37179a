use anyhow::Result;
use clap::{Args, Subcommand};
use redlite_engine::bench::{bench_gen, bench_gen_mtp, bench_prompt, BenchResult};
use redlite_engine::sampling::SamplingParams;

use crate::loader::{load, ModelArgs};
use crate::profile;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct BenchArgs {
    /// A kernel benchmark instead of the llama-bench tests.
    #[command(subcommand)]
    kernels: Option<BenchKernels>,
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt lengths to time (pp tests); 0 to skip.
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    n_prompt: Vec<usize>,
    /// Tokens to generate (tg tests); 0 to skip.
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    n_gen: usize,
    /// Context depths before the tg test.
    #[arg(
        short = 'd',
        long = "depth",
        value_delimiter = ',',
        default_value = "0"
    )]
    depth: Vec<usize>,
    /// Repetitions (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 3)]
    repetitions: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// With --mtp, benchmark only: force these per-draft acceptance rates (each in [0, 1])
    /// instead of the trunk's verdict, to time the speed-up curve (the text is then not the
    /// model's). Empty: real acceptance.
    #[arg(long = "mtp-accept", value_delimiter = ',', value_name = "RATES")]
    mtp_accept: Vec<f64>,
    /// Sample the tg tests' tokens at this temperature, with the other sampling defaults of
    /// generate and chat (top-k 40, top-p 0.95, min-p 0.05), each from the last token's logits
    /// read on the host, as a chat decodes (tests named `... t<temp>`); with --mtp the drafts
    /// and the verification go through the sampled acceptance rule. Default: llama-bench's
    /// fixed tokens (greedy drafts and verification with --mtp).
    #[arg(long = "temp", value_name = "T")]
    temp: Option<f32>,
    /// With --device cuda: after each test, where the GPU's time went per model component
    /// (CUDA events, mean over the warm-up and timed runs; a tg test at a depth includes the
    /// context's prefill). The decode graph is off meanwhile, so tg figures are eager ones.
    #[arg(long)]
    profile: bool,
}

#[derive(Subcommand)]
enum BenchKernels {
    /// One layer's routed-expert products on the GPU, q8 (dp4a) vs tensor-core (mma)
    /// kernels, as JSON (time, TFLOP/s-equivalent, GB/s per projection and block type).
    Experts(crate::commands::bench_experts::ExpertsArgs),
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    if let Some(BenchKernels::Experts(experts)) = &args.kernels {
        return crate::commands::bench_experts::run(experts);
    }
    if !args.mtp_accept.is_empty() && !args.model.mtp {
        anyhow::bail!("--mtp-accept forces the acceptance of MTP drafts: it needs --mtp");
    }
    if let Some(r) = args.mtp_accept.iter().find(|r| !(0.0..=1.0).contains(*r)) {
        anyhow::bail!("--mtp-accept {r} is outside [0, 1]");
    }
    let sampling = args
        .temp
        .map(|temperature| {
            let params = SamplingParams {
                temperature,
                ..SamplingParams::default()
            };
            params.validate().map(|()| params)
        })
        .transpose()?;
    let longest_pp = args.n_prompt.iter().copied().max().unwrap_or(0);
    let longest_tg = args.depth.iter().copied().max().unwrap_or(0) + args.n_gen;
    args.model.ctx = args.model.ctx.max(longest_pp).max(longest_tg);
    // One prefill call per pp test, as llama-bench's default batch does.
    args.model.chunk = args.model.chunk.max(longest_pp);
    profile::enable(args.profile, &args.model.device)?;
    let mut loaded = load(&args.model)?;
    profile::discard(args.profile)?;
    let runs = args.repetitions + 1;
    let mut results: Vec<BenchResult> = Vec::new();
    // The pp and plain tg tests run without the MTP block's cost (its prefill and per-token
    // catch-up); `tg N mtpK` turns it on.
    loaded.session.reset();
    loaded.session.disable_mtp();
    for &p in args.n_prompt.iter().filter(|&&p| p > 0) {
        results.push(bench_prompt(loaded.session.as_mut(), p, args.repetitions)?);
        report(results.last(), args.json);
        profile::print(args.profile, &format!("pp{p}"), runs, p)?;
    }
    if args.n_gen > 0 {
        for &d in &args.depth {
            results.push(bench_gen(
                loaded.session.as_mut(),
                args.n_gen,
                d,
                args.repetitions,
                sampling.as_ref(),
            )?);
            report(results.last(), args.json);
            let test = results.last().map_or(String::new(), |r| r.test.clone());
            profile::print(args.profile, &test, runs, args.n_gen)?;
        }
        if args.model.mtp {
            loaded.session.reset();
            loaded.session.enable_mtp()?;
            let rates: Vec<Option<f64>> = if args.mtp_accept.is_empty() {
                vec![None]
            } else {
                args.mtp_accept.iter().copied().map(Some).collect()
            };
            for &d in &args.depth {
                for &rate in &rates {
                    results.push(bench_gen_mtp(
                        loaded.session.as_mut(),
                        args.n_gen,
                        (d, args.repetitions),
                        (args.model.draft, rate),
                        sampling.as_ref(),
                    )?);
                    report(results.last(), args.json);
                }
            }
        }
    }
    let threads = rayon::current_num_threads();
    if args.json {
        let out = serde_json::json!({
            "model": loaded.gguf.files()[0].path().display().to_string(),
            "model_bytes": loaded.gguf.file_bytes(),
            "backend": loaded.device,
            "simd": redlite_quant::simd_level(),
            "precision": if std::env::var("REDLITE_CPU_EXACT").as_deref() == Ok("1") { "exact" } else { "ggml" },
            "threads": threads,
            "kv": args.model.kv,
            "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(())
}

fn report(result: Option<&BenchResult>, json: bool) {
    if let (Some(r), false) = (result, json) {
        let mtp = r.mtp.as_ref().map_or(String::new(), |m| {
            format!(
                " drafted {}, accepted {} ({:.1} %), mean accepted length {:.2}; per step: draft {:.1} ms, verify {:.1} ms (checkpoint {:.2}), rollback {:.1} ms",
                m.stats.drafted,
                m.stats.accepted,
                100.0 * m.acceptance_rate,
                m.mean_accepted,
                m.draft_ms,
                m.verify_ms,
                m.checkpoint_ms,
                m.rollback_ms
            )
        });
        let cache = r.expert_cache.as_ref().map_or(String::new(), |c| {
            format!(
                " expert cache: hit rate {:.1} %, {:.1} experts ({:.1} MiB) copied per token, waited for {:.2} ms per token",
                100.0 * c.hit_rate,
                c.misses_per_token,
                c.bytes_per_token / (1u64 << 20) as f64,
                c.wait_ms_per_token
            ) + &match c.prefetched_per_token > 0.0 {
                true => format!(
                    ", {:.1} experts prefetched per token ({:.1} % of them used)",
                    c.prefetched_per_token,
                    100.0 * c.prefetch_used
                ),
                false => String::new(),
            }
        });
        println!(
            "| {:<22} | {:>10.2} ± {:<8.2} t/s |{mtp}{cache}",
            r.test, r.avg_ts, r.stddev_ts
        );
    }
}
