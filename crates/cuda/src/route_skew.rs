//! Benchmark-only skewed routing (issue 8; `REDLITE_BENCH_ROUTE_SKEW`, docs/CUDA.md): after
//! the routing kernel, each token's chosen experts are replaced by as many distinct experts
//! drawn from a fixed popularity law per layer, the router's weights kept
//! (`moe_route_skew_kernel`, `moe_route.cu`). Not the model's output: a stand-in for the
//! routing of a trained model, which synthetic files (random weights) do not have, so that the
//! expert cache can be measured between its worst case (`REDLITE_BENCH_ROUTE_SPREAD=1`,
//! uniform) and a routing with the skew measured on the Qwen3 MoE family.
//!
//! The law: expert rank `x · n_expert` (x in [0, 1), rank 0 the hottest) has density
//! ∝ exp(-x / decay). One parameter, and scale-free: the hottest fraction f of the experts
//! takes (1 - e^(-f/decay)) / (1 - e^(-1/decay)) of the picks whatever the expert count, so
//! a fit on 128 experts carries over to qwen3next's 512. The fit: the only per-layer figure we
//! found published for the family is the "Routing De-risk" page of the gpu-container
//! handbook (mcp-tool-shop-org.github.io/gpu-container/handbook/derisk/), which counted
//! Qwen3-30B-A3B's routing (128 experts, top 8; llama-imatrix's per-layer expert counts):
//! a diverse prose/code/math workload (~1k tokens) needs 65 of 128 experts (51 %) per layer
//! for 90 % of the routing, concentration (1 - normalized entropy) 0.111, hottest expert 4.3 %
//! of the picks; a single-domain Python workload (~8k tokens) 58 of 128 (45 %), 0.154, 6.3 %.
//! Simulating 8 distinct picks per token from the law, decay 0.22 gives 65 experts for 90 %
//! and concentration 0.111 (hottest 3.4 %), decay 0.19 gives 58 (0.135, hottest 3.8 %): the
//! two published workloads ([`RouteSkew::QWEN3_DIVERSE`], [`RouteSkew::QWEN3_NARROW`]). The
//! law has no memory: tokens draw independently, so the consecutive-token locality of real
//! routing (which favours LRU) is not modelled; the page measured frequencies only.

use cudarc::driver::{CudaView, CudaViewMut};

use crate::device::Device;
use crate::error::{CudaError, CudaOp};
use crate::layer_launch::{config, to_i32};
use crate::ops::{fits, shape};
use crate::raw;
use crate::source::MOE_ROUTE_SKEW_KERNEL;

/// Threads of a CTA of the kernel (`ROUTE_SKEW_THREADS` there), one per token.
const SKEW_THREADS: usize = 128;

/// A popularity law over each layer's experts: rank `x · n_expert` drawn with density
/// ∝ exp(-x / decay) (module docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteSkew {
    decay: f32,
}

impl RouteSkew {
    /// The decay fitted to Qwen3-30B-A3B's diverse workload: 90 % of the picks on the hottest
    /// 51 % of the experts.
    pub const QWEN3_DIVERSE: f32 = 0.22;
    /// The decay fitted to its single-domain (Python) workload: 90 % on the hottest 45 %.
    pub const QWEN3_NARROW: f32 = 0.19;

    /// The law of `decay` (a fraction of the experts), if it is a number from 0.01 to 100.
    pub fn new(decay: f32) -> Option<RouteSkew> {
        (decay.is_finite() && (0.01..=100.0).contains(&decay)).then_some(RouteSkew { decay })
    }

    pub fn decay(self) -> f32 {
        self.decay
    }

    /// The share of the draws that land on the hottest `fraction` of the experts (before
    /// repeated draws within a token are drawn again, which flattens the hottest ranks a
    /// little).
    pub fn share_of_hottest(self, fraction: f64) -> f64 {
        let decay = f64::from(self.decay);
        (1.0 - (-fraction / decay).exp()) / (1.0 - (-1.0 / decay).exp())
    }
}

/// The seed of layer `layer`'s random stream and its permutation of ranks into experts,
/// `expert = (stride · rank + offset) mod n_expert` (stride coprime to n_expert: a bijection).
pub fn skew_permutation(layer: usize, n_expert: usize) -> (u32, u32, u32) {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let h = mix((layer as u64).wrapping_add(0x9e37_79b9_7f4a_7c15));
    let n = n_expert.max(1) as u64;
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut stride = 1 + (h >> 32) % n;
    while gcd(stride, n) != 1 {
        stride = stride % n + 1;
    }
    let offset = (h & 0xffff_ffff) % n;
    let narrow = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    (narrow(h >> 40), narrow(stride), narrow(offset))
}

/// Replaces each token's expert ids (`ids`, `[tokens][used]`) by `used` distinct experts
/// drawn from `skew` with layer `layer`'s permutation, the random stream seeded by the
/// token's router logits (`logits`, `[tokens][n_expert]`). Weights are left as they are.
pub fn moe_route_skew(
    device: &Device,
    skew: RouteSkew,
    layer: usize,
    logits: &CudaView<'_, f32>,
    ids: &mut CudaViewMut<'_, i32>,
    n_expert: usize,
) -> Result<(), CudaError> {
    let op = CudaOp::MoeRoute;
    if n_expert == 0 {
        return Err(CudaError::Shape {
            op,
            what: "experts (at least 1)",
            expected: 1,
            found: 0,
        });
    }
    let tokens = logits.len() / n_expert;
    shape(
        op,
        "logits length (tokens x n_expert)",
        tokens * n_expert,
        logits.len(),
    )?;
    if tokens == 0 {
        return Ok(());
    }
    let used = ids.len() / tokens;
    shape(op, "ids length (tokens x used)", tokens * used, ids.len())?;
    fits(op, "experts used", used as u64, n_expert as u64)?;
    fits(op, "experts", n_expert as u64, i32::MAX as u64)?;
    fits(op, "tokens", tokens as u64, i32::MAX as u64)?;
    let (seed, stride, offset) = skew_permutation(layer, n_expert);
    let kernel = device.kernel(MOE_ROUTE_SKEW_KERNEL)?;
    crate::profile::label(|| format!("moe_route_skew tokens{tokens} layer{layer}"));
    let cfg = config(
        (tokens.div_ceil(SKEW_THREADS), 1, 1),
        SKEW_THREADS as u32,
        0,
    );
    raw::launch_moe_route_skew(
        device.stream(),
        kernel,
        cfg,
        logits,
        ids,
        (to_i32(tokens), to_i32(n_expert), to_i32(used)),
        (seed, stride, offset),
        skew.decay,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_layer_permutes_the_experts() {
        for n_expert in [1, 7, 16, 128, 512, 1000] {
            let mut hottest = std::collections::HashSet::new();
            for layer in 0..49 {
                let (_, stride, offset) = skew_permutation(layer, n_expert);
                let mut seen = vec![false; n_expert];
                for rank in 0..n_expert as u64 {
                    let e = (u64::from(stride) * rank + u64::from(offset)) % n_expert as u64;
                    assert!(
                        !seen[e as usize],
                        "{n_expert} experts, layer {layer}: {e} twice"
                    );
                    seen[e as usize] = true;
                }
                hottest.insert(offset);
            }
            // The hottest expert of 49 layers: mostly different ones (chance repeats aside).
            if n_expert >= 128 {
                assert!(hottest.len() > 30, "{n_expert} experts: {hottest:?}");
            }
        }
    }

    #[test]
    fn the_fits_put_ninety_percent_on_the_published_share_of_experts() {
        let diverse = RouteSkew::new(RouteSkew::QWEN3_DIVERSE).unwrap();
        let narrow = RouteSkew::new(RouteSkew::QWEN3_NARROW).unwrap();
        // Hottest 65 and 58 of 128 experts (the draws before repeats are drawn again).
        assert!((diverse.share_of_hottest(65.0 / 128.0) - 0.90).abs() < 0.015);
        assert!((narrow.share_of_hottest(58.0 / 128.0) - 0.90).abs() < 0.015);
        assert_eq!(RouteSkew::new(0.0), None);
        assert_eq!(RouteSkew::new(f32::NAN), None);
    }
}
