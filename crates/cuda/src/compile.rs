//! Compiling the kernel modules with NVRTC for one architecture, through the disk cache.
//! Needs libnvrtc but no GPU.

use crate::cache::{cache_dir, cache_key, load, store};
use crate::error::CudaError;
use crate::raw::{self, Compiled};
use crate::source::{modules, ModuleSource};
use rayon::prelude::*;

/// Checks `arch` is `sm_` followed by two or three digits and an optional `a` (sm_90a).
pub fn check_arch(arch: &str) -> Result<(), CudaError> {
    let digits = arch
        .strip_prefix("sm_")
        .map(|rest| rest.strip_suffix('a').unwrap_or(rest));
    match digits {
        Some(d) if (2..=3).contains(&d.len()) && d.bytes().all(|b| b.is_ascii_digit()) => Ok(()),
        _ => Err(CudaError::BadArch {
            arch: arch.to_string(),
        }),
    }
}

/// `REDLITE_SHARED_TABLES=0` builds the float kernels with the IQ codebooks read from
/// global memory (see `blocks.cuh`), `REDLITE_Q8_SHARED_TABLES=0` the q8 kernels with them
/// read from global memory instead of copied to shared memory (see `q8dot.cuh`; the token
/// tiles read them from global memory either way), `REDLITE_BENCH_ROUTE_SPREAD=1` the routing
/// kernels spreading each token's experts uniformly (a benchmark of the expert cache's worst
/// case, see `moe_route.cu`), `REDLITE_PROBE_Q8_NO_QUANTIZE=1` the q8 kernels staging zero
/// codes instead of quantizing their input (a measurement probe, wrong results on purpose:
/// see `q8dot.cuh`), `REDLITE_Q8_LOADS_AHEAD=0` the one-token q8 products loading each item
/// where they use it (`q8dot.cuh`), `REDLITE_PDL=0` the kernels without their programmatic
/// dependent launch wait (`common.cuh`'s `pdl_begin`, launched with the attribute by
/// `raw/launcher.rs`), `REDLITE_DOWN_WARPS=4` the preloading expert down on CTAs of 4 warps
/// instead of 8 (`source::down_warps`), `REDLITE_TIMELINE=1` every launch's clocks recorded
/// (`timeline.rs`), `REDLITE_ATTN_WIDE_LOADS=0` the attention split kernels reading each lane's
/// values of a K or V row strided by 32 instead of as one run of 16-byte loads (other score
/// sums, `attention.cu`), `REDLITE_Q8_DECODE_ONCE=0` the token-tile products decoding each
/// weight item again for every token (`q8decode.cuh`; the same bits),
/// `REDLITE_SIGN_PRMT=0` the IQ2 sign masks without the byte permute (`q8dot.cuh`; the
/// same masks), `REDLITE_IQ2_SIGNS_COMPUTED=0` the IQ2 sign masks of the q8 and tensor-core
/// products read from the sign table instead of computed from the sign index (`q8dot.cuh`;
/// the same masks), `REDLITE_GATE_UP_BATCH_BLOCKS=N` the batches' expert gate/up held to N
/// CTAs a multiprocessor (`moe.cu`; registers only, the same bits).
/// `REDLITE_NVRTC_VERBOSE=1` asks ptxas for each kernel's registers and local memory
/// ([`ModuleCompiled::kernels`]). The options are part of the cache key.
fn options(arch: &str) -> Vec<String> {
    let shared_tables = std::env::var("REDLITE_SHARED_TABLES").as_deref() != Ok("0");
    let q8_shared_tables = std::env::var("REDLITE_Q8_SHARED_TABLES").as_deref() != Ok("0");
    let route_spread = std::env::var("REDLITE_BENCH_ROUTE_SPREAD").as_deref() == Ok("1");
    let no_quantize = std::env::var("REDLITE_PROBE_Q8_NO_QUANTIZE").as_deref() == Ok("1");
    let verbose = std::env::var("REDLITE_NVRTC_VERBOSE").as_deref() == Ok("1");
    let loads_ahead = std::env::var("REDLITE_Q8_LOADS_AHEAD").as_deref() != Ok("0");
    let wide_loads = std::env::var("REDLITE_ATTN_WIDE_LOADS").as_deref() != Ok("0");
    let decode_once = std::env::var("REDLITE_Q8_DECODE_ONCE").as_deref() != Ok("0");
    let sign_prmt = std::env::var("REDLITE_SIGN_PRMT").as_deref() != Ok("0");
    let signs_computed = std::env::var("REDLITE_IQ2_SIGNS_COMPUTED").as_deref() != Ok("0");
    let batch_blocks: u32 = std::env::var("REDLITE_GATE_UP_BATCH_BLOCKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n: &u32| n <= 16)
        .unwrap_or(0);
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--extra-device-vectorization".to_string(),
        format!("-DREDLITE_SHARED_TABLES={}", u8::from(shared_tables)),
        format!("-DREDLITE_Q8_SHARED_TABLES={}", u8::from(q8_shared_tables)),
        format!("-DREDLITE_ROUTE_SPREAD={}", u8::from(route_spread)),
        format!("-DREDLITE_PROBE_Q8_NO_QUANTIZE={}", u8::from(no_quantize)),
        format!("-DREDLITE_Q8_LOADS_AHEAD={}", u8::from(loads_ahead)),
        format!("-DREDLITE_PDL={}", u8::from(raw::pdl_requested())),
        format!("-DREDLITE_TIMELINE={}", u8::from(crate::timeline::on())),
        format!("-DATTN_WIDE_LOADS={}", u8::from(wide_loads)),
        format!("-DREDLITE_Q8_DECODE_ONCE={}", u8::from(decode_once)),
        format!("-DREDLITE_SIGN_PRMT={}", u8::from(sign_prmt)),
        format!("-DREDLITE_IQ2_SIGNS_COMPUTED={}", u8::from(signs_computed)),
        format!("-DREDLITE_GATE_UP_BATCH_BLOCKS={batch_blocks}"),
        // Not read by the sources: it names the expert down's instantiation (`down_warps`),
        // so it keys the cache too.
        format!(
            "-DREDLITE_DOWN_WARPS={}",
            crate::source::down_warps_option()
        ),
    ];
    if verbose {
        options.push("--ptxas-options=-v".to_string());
    }
    options
}

/// The loaded NVRTC's version, or [`CudaError::NoNvrtc`].
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    if !raw::nvrtc_present() {
        return Err(CudaError::NoNvrtc);
    }
    raw::nvrtc_version()
}

fn compile_uncached(module: &ModuleSource, arch: &str) -> Result<Compiled, CudaError> {
    raw::nvrtc_compile(
        &module.name,
        arch,
        &module.source,
        &options(arch),
        &module.kernels,
    )
}

/// Compiles `module` for `arch`, or takes it from the disk cache. A cache that cannot be
/// written costs a recompile next time, not a failure now.
pub(crate) fn compile_cached(module: &ModuleSource, arch: &str) -> Result<Compiled, CudaError> {
    check_arch(arch)?;
    let version = nvrtc_version()?;
    let Some(dir) = cache_dir() else {
        return compile_uncached(module, arch);
    };
    let key = cache_key(
        &module.source,
        arch,
        &options(arch),
        &module.kernels,
        version,
    );
    if let Some(compiled) = load(&dir, &key, &module.kernels) {
        return Ok(compiled);
    }
    let compiled = compile_uncached(module, arch)?;
    let _ = store(&dir, &key, &compiled);
    Ok(compiled)
}

/// Every kernel module compiled for `arch` (through the disk cache), in `modules()` order,
/// side by side on rayon's pool: NVRTC compiles are independent and single-threaded, so a
/// fresh machine's first run compiles its modules at once instead of one after another.
pub(crate) fn compile_modules_cached(
    modules: &[ModuleSource],
    arch: &str,
) -> Result<Vec<Compiled>, CudaError> {
    modules
        .par_iter()
        .map(|module| compile_cached(module, arch))
        .collect()
}

/// One module's outcome in [`compile_all`]: `Err` holds the compiler log.
#[derive(Debug)]
pub struct ModuleCompiled {
    pub name: String,
    pub result: Result<(), String>,
    /// Wall time of this module's compile.
    pub seconds: f64,
    /// What ptxas reported for each kernel (empty unless `REDLITE_NVRTC_VERBOSE=1`).
    pub kernels: Vec<KernelResources>,
}

/// One kernel's resources as ptxas reports them (`--ptxas-options=-v`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelResources {
    /// The name expression (`matmul_q8_kernel<Q4K, 8, 2>`).
    pub kernel: String,
    pub registers: u32,
    /// Bytes of local memory per thread: a stack frame, spills.
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
}

impl KernelResources {
    /// Whether the kernel touches local memory at all (a stack frame or spills): in the
    /// decode kernels that means a store and reload on the path of every weight load.
    pub fn uses_local_memory(&self) -> bool {
        self.stack_frame > 0 || self.spill_stores > 0 || self.spill_loads > 0
    }
}

/// The per-kernel lines of a ptxas `-v` log, named by their expressions (`lowered`: the
/// (expression, mangled name) pairs of the module). Lines of other functions are skipped.
fn kernel_resources(log: &str, lowered: &[(String, String)]) -> Vec<KernelResources> {
    let expression = |mangled: &str| {
        lowered
            .iter()
            .find(|(_, name)| name == mangled)
            .map(|(e, _)| e.clone())
    };
    let numbers = |line: &str| -> Vec<u32> {
        line.split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse().ok())
            .collect()
    };
    let mut found = Vec::new();
    let mut current: Option<KernelResources> = None;
    for line in log.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            if let Some(done) = current.take() {
                found.push(done);
            }
            current = expression(rest.trim()).map(|kernel| KernelResources {
                kernel,
                ..KernelResources::default()
            });
        } else if let Some(kernel) = current.as_mut() {
            if line.contains("bytes stack frame") {
                if let [stack, stores, loads, ..] = numbers(line)[..] {
                    (kernel.stack_frame, kernel.spill_stores, kernel.spill_loads) =
                        (stack, stores, loads);
                }
            } else if let Some(rest) = line.split("Used ").nth(1) {
                kernel.registers = numbers(rest).first().copied().unwrap_or(0);
            }
        }
    }
    found.extend(current);
    found
}

/// Compiles every kernel module for `arch` without the cache (and without a GPU), the
/// modules side by side; with `REDLITE_CUBIN_DIR` set, each module's CUBIN is written there
/// as `ARCH-MODULE.cubin`. The outer error is a bad `arch` or no NVRTC.
pub fn compile_all(arch: &str) -> Result<Vec<ModuleCompiled>, CudaError> {
    check_arch(arch)?;
    nvrtc_version()?;
    // REDLITE_NVRTC_MODULES=PREFIX: only the modules whose names start so (a quicker check of
    // one family while editing it).
    let only = std::env::var("REDLITE_NVRTC_MODULES").unwrap_or_default();
    let modules: Vec<ModuleSource> = modules()
        .into_iter()
        .filter(|m| m.name.starts_with(&only))
        .collect();
    Ok(modules
        .par_iter()
        .map(|module| {
            let started = std::time::Instant::now();
            let compiled = compile_uncached(module, arch);
            let kernels = compiled
                .as_ref()
                .map(|c| kernel_resources(&c.log, &c.lowered))
                .unwrap_or_default();
            let mut result = compiled.as_ref().map(|_| ()).map_err(|e| e.to_string());
            // REDLITE_CUBIN_DIR: each module's CUBIN written there (for cuobjdump -sass); a
            // CUBIN asked for and not written fails the module.
            if let (Ok(c), Some(dir)) = (&compiled, std::env::var_os("REDLITE_CUBIN_DIR")) {
                let path = std::path::Path::new(&dir).join(format!("{arch}-{}.cubin", module.name));
                if let Err(e) = std::fs::write(&path, &c.image) {
                    result = Err(format!("writing {}: {e}", path.display()));
                }
            }
            ModuleCompiled {
                name: module.name.clone(),
                result,
                seconds: started.elapsed().as_secs_f64(),
                kernels,
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptxas_lines_become_kernel_resources() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function '_Z1kILi1EEvv' for 'sm_90'\n\
            ptxas info    : Function properties for _Z1kILi1EEvv\n\
            \x20   48 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 255 registers, used 0 barriers, 2192 bytes smem\n\
            ptxas info    : Function properties for _Z5otherv\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Function properties for _Z1kILi2EEvv\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 64 registers\n";
        let lowered = [
            ("k<1>".to_string(), "_Z1kILi1EEvv".to_string()),
            ("k<2>".to_string(), "_Z1kILi2EEvv".to_string()),
        ];
        let found = kernel_resources(log, &lowered);
        let first = KernelResources {
            kernel: "k<1>".into(),
            registers: 255,
            stack_frame: 48,
            spill_stores: 8,
            spill_loads: 12,
        };
        let second = KernelResources {
            kernel: "k<2>".into(),
            registers: 64,
            ..KernelResources::default()
        };
        assert_eq!(found, [first.clone(), second.clone()]);
        assert!(first.uses_local_memory() && !second.uses_local_memory());
    }

    #[test]
    fn arch_names() {
        for good in ["sm_80", "sm_90", "sm_90a", "sm_100", "sm_120a"] {
            assert!(check_arch(good).is_ok(), "{good}");
        }
        for bad in ["", "sm_9", "compute_90", "sm_9x", "90", "sm_1000"] {
            assert!(check_arch(bad).is_err(), "{bad}");
        }
    }
}
