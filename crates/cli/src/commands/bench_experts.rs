//! `redlite bench experts`: one layer's routed-expert products (gate/up with SwiGLU, down
//! with the weighted sum) for a prompt of `--tokens` tokens, on the GPU, through the q8
//! (dp4a) kernels and the int8 tensor-core (mma) kernels, as JSON: milliseconds per
//! projection, TFLOP/s-equivalent (2 x pairs x rows x cols per matrix) and GB/s of the
//! expert weights the routing touches. Routing is random (distinct experts per token,
//! deterministic), inputs random: speed does not depend on the values. `group_ms` times the
//! device grouping of the pairs by expert, `host_group_ms` the host one (ids copied back).

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

#[derive(Args)]
pub struct ExpertsArgs {
    /// The GGUF file (the first part of a split file).
    #[arg(short = 'm', long = "model")]
    model: PathBuf,
    /// Prompt tokens routed through the layer.
    #[arg(short = 't', long = "tokens", default_value_t = 512)]
    tokens: usize,
    /// The layer whose experts are timed.
    #[arg(short = 'l', long = "layer", default_value_t = 0)]
    layer: usize,
    /// Timed repetitions (after one warm-up run).
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
}

pub fn run(args: &ExpertsArgs) -> Result<()> {
    if args.tokens == 0 || args.repetitions == 0 {
        anyhow::bail!("bench experts needs --tokens and --repetitions of at least 1");
    }
    #[cfg(feature = "cuda")]
    {
        gpu::run(args)
    }
    #[cfg(not(feature = "cuda"))]
    anyhow::bail!(
        "bench experts times GPU kernels: this redlite was built without CUDA; rebuild with \
         `cargo build --release --features cuda`"
    )
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::ExpertsArgs;
    use anyhow::{bail, Context, Result};
    use redlite_cuda::{
        mma_takes, moe_down, moe_down_mma, moe_gate_up, moe_gate_up_mma, CudaSlice, Device, Dots,
        MmaGroups, MmaTiles, WeightMatrix,
    };
    use redlite_engine::model::load::config_from_gguf;
    use redlite_gguf::GgufModel;
    use serde_json::json;
    use std::time::Instant;

    /// One expert stack on the device.
    struct Stack {
        name: String,
        ty: redlite_gguf::GgmlType,
        rows: usize,
        cols: usize,
        bytes: CudaSlice<u8>,
    }

    impl Stack {
        fn load(device: &Device, gguf: &GgufModel, name: String) -> Result<Stack> {
            let loc = gguf
                .locate(&name)
                .with_context(|| format!("tensor {name} is not in the file"))?;
            let info = gguf.info(loc);
            Ok(Stack {
                ty: info.ty,
                rows: info.rows() as usize,
                cols: info.row_len() as usize,
                bytes: device.upload(gguf.data(loc))?,
                name,
            })
        }

        fn view(&self) -> WeightMatrix<'_> {
            WeightMatrix {
                ty: self.ty,
                rows: self.rows,
                cols: self.cols,
                bytes: self.bytes.as_view(),
                dots: Dots::Q8K,
            }
        }

        fn bytes_per_expert(&self, n_expert: usize) -> usize {
            self.bytes.len() / n_expert.max(1)
        }
    }

    /// Mean milliseconds of `reps` runs of `f` after one warm-up, each ended by a sync.
    fn time(device: &Device, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
        f()?;
        device.synchronize()?;
        let mut total = 0.0;
        for _ in 0..reps {
            let start = Instant::now();
            f()?;
            device.synchronize()?;
            total += start.elapsed().as_secs_f64();
        }
        Ok(total * 1e3 / reps as f64)
    }

    /// SplitMix64 for deterministic ids and inputs.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn signed(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    pub fn run(args: &ExpertsArgs) -> Result<()> {
        let gguf = GgufModel::open(&args.model)?;
        let config = config_from_gguf(&gguf)?;
        let (n_expert, used, embd, ff) = (
            config.n_expert,
            config.n_expert_used,
            config.n_embd,
            config.expert_ff,
        );
        if args.layer >= config.n_layer {
            bail!(
                "--layer {} is past the file's {} layers",
                args.layer,
                config.n_layer
            );
        }
        let device = Device::open(0)?;
        let name = |what: &str| format!("blk.{}.{what}.weight", args.layer);
        let gate = Stack::load(&device, &gguf, name("ffn_gate_exps"))?;
        let up = Stack::load(&device, &gguf, name("ffn_up_exps"))?;
        let down = Stack::load(&device, &gguf, name("ffn_down_exps"))?;
        let tokens = args.tokens;
        let pairs = tokens * used;

        let mut rng = Rng(7);
        let ids: Vec<i32> = (0..tokens)
            .flat_map(|_| {
                let mut chosen: Vec<i32> = Vec::with_capacity(used);
                while chosen.len() < used.min(n_expert) {
                    let e = (rng.next() % n_expert as u64) as i32;
                    if !chosen.contains(&e) {
                        chosen.push(e);
                    }
                }
                chosen
            })
            .collect();
        let mut hit = vec![false; n_expert];
        for &e in &ids {
            hit[e as usize] = true;
        }
        let distinct = hit.iter().filter(|&&h| h).count();
        let x: Vec<f32> = (0..tokens * embd).map(|_| rng.signed()).collect();
        let act_host: Vec<f32> = (0..pairs * ff).map(|_| rng.signed()).collect();
        let weights = vec![1.0 / used as f32; pairs];
        let (ids_device, x) = (device.upload(&ids)?, device.upload(&x)?);
        let (act_in, weights) = (device.upload(&act_host)?, device.upload(&weights)?);
        let mut act = device.alloc_zeros::<f32>(pairs * ff)?;
        let mut out = device.alloc_zeros::<f32>(tokens * embd)?;
        let tiles = MmaTiles::new(&ids, used, n_expert).context("routing out of range")?;
        let tiles = MmaGroups::upload(&device, &tiles)?;
        let host_group_ms = time(&device, args.repetitions, || {
            let mut host = vec![0i32; pairs];
            device.copy_to_host(&ids_device.as_view(), &mut host)?;
            let tiles = MmaTiles::new(&host, used, n_expert).context("routing out of range")?;
            MmaGroups::upload(&device, &tiles)?;
            Ok(())
        })?;
        let group_ms = time(&device, args.repetitions, || {
            MmaGroups::on_device(&device, &ids_device.as_view(), used, n_expert)?;
            Ok(())
        })?;

        let (g, u, d) = (gate.view(), up.view(), down.view());
        let reps = args.repetitions;
        let mut results = Vec::new();
        let mut record = |projection: &str, stack: &Stack, kernels: &str, ms: f64, flop, bytes| {
            results.push(json!({
                "projection": projection,
                "tensor": stack.name,
                "type": stack.ty.name(),
                "kernels": kernels,
                "ms": ms,
                "tflops": flop / (ms * 1e-3) / 1e12,
                "gbs": bytes / (ms * 1e-3) / 1e9,
            }));
        };
        let gate_up_flop = 2.0 * 2.0 * (pairs * ff * embd) as f64;
        let gate_up_bytes = (distinct * 2 * gate.bytes_per_expert(n_expert)) as f64;
        let down_flop = 2.0 * (pairs * embd * ff) as f64;
        let down_bytes = (distinct * down.bytes_per_expert(n_expert)) as f64;
        let ids_view = ids_device.as_view();
        let ms = time(&device, reps, || {
            moe_gate_up(
                &device,
                &g,
                &u,
                ff,
                &ids_view,
                (&x.as_view(), None),
                &mut act.as_view_mut(),
                None,
            )?;
            Ok(())
        })?;
        record("gate_up", &gate, "dp4a", ms, gate_up_flop, gate_up_bytes);
        let (act_view, w_view) = (act_in.as_view(), weights.as_view());
        let ms = time(&device, reps, || {
            let out = &mut out.as_view_mut();
            moe_down(
                &device, &d, embd, &ids_view, &w_view, &act_view, out, false, None, true,
            )?;
            Ok(())
        })?;
        record("down", &down, "dp4a", ms, down_flop, down_bytes);
        if mma_takes(&device, &g, tokens) && mma_takes(&device, &u, tokens) {
            let ms = time(&device, reps, || {
                let act = &mut act.as_view_mut();
                moe_gate_up_mma(&device, &g, &u, ff, &tiles, &x.as_view(), act)?;
                Ok(())
            })?;
            record("gate_up", &gate, "mma", ms, gate_up_flop, gate_up_bytes);
        }
        if mma_takes(&device, &d, tokens) {
            let ms = time(&device, reps, || {
                let out = &mut out.as_view_mut();
                moe_down_mma(&device, &d, embd, &tiles, &w_view, &act_view, out, false)?;
                Ok(())
            })?;
            record("down", &down, "mma", ms, down_flop, down_bytes);
        }
        let report = json!({
            "test": "experts",
            "model": args.model.display().to_string(),
            "device": device.name()?,
            "layer": args.layer,
            "tokens": tokens,
            "n_expert": n_expert,
            "n_expert_used": used,
            "experts_hit": distinct,
            "repetitions": reps,
            "group_ms": group_ms,
            "host_group_ms": host_group_ms,
            "results": results,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
        Ok(())
    }
}
