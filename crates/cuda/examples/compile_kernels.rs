//! Compiles every kernel module with NVRTC for each architecture given (default sm_80 and
//! sm_90). Needs libnvrtc on the loader path but no GPU; the CI check runs it.
//!
//! `cargo run -p redlite-cuda --example compile_kernels -- sm_80 sm_90`
//!
//! With `REDLITE_NVRTC_VERBOSE=1` ptxas reports each kernel's registers and local memory; the
//! kernels that use local memory are listed, and a q8 product kernel (`_q8_` in its name) or
//! the fused DeltaNet step among them fails the run unless it is a known one: a run-time
//! index into a register array once put every Q4_K / Q5_K item through a local store and
//! reload, which serialized each lane's weight loads (12 us instead of ~6 for a 8192 x 2048
//! product).

use redlite_cuda::{compile_all, nvrtc_version, KernelResources};
use std::process::ExitCode;
use std::time::Instant;

/// q8 kernels known to keep a few bytes in local memory, (prefix, suffix) of their names:
/// variants that are not defaults (one row per lane group for the expert gate/up, in the
/// one-token and the batch modules, four for the plain expert down, and on sm_80 four for
/// the cached gate/up of IQ1_M, whose items loaded ahead take four registers each since
/// 74a2525: 8 bytes spilled), and IQ2_XS's gate/up with two rows a lane group, 8 bytes since
/// its codebook is read from shared memory (fortieth session): with 16 lanes a row (rows of
/// at most 512 values; the 80B model's take 32) on sm_80 and sm_90, with 32 on sm_80 only;
/// the same in the batches' gate/up since it reads the codebooks from shared memory too
/// (`moe_batch_shared`, forty-third session);
/// the fused DeltaNet step's whole groups of 3 and 4 rows at DK 128 (forty-second session:
/// 112-152 bytes of scalars around the rows' loop, the state column in registers).
const KNOWN_LOCAL: [(&str, &str); 8] = [
    ("deltanet_step_kernel<128, 4, ", ", 3>"),
    ("deltanet_step_kernel<128, 4, ", ", 4>"),
    ("moe_gate_up_q8_kernel<", ", 1>"),
    ("moe_gate_up_q8_batch_kernel<", ", 1>"),
    ("moe_down_q8_kernel<", ", 4>"),
    ("moe_gate_up_q8_cached_kernel<IQ1M, ", ", 4>"),
    ("moe_gate_up_q8_kernel<IQ2XS, 4, ", ", 2>"),
    ("moe_gate_up_q8_batch_kernel<IQ2XS, 4, ", ", 2>"),
];

fn local_memory_refused(kernel: &KernelResources) -> bool {
    let name = &kernel.kernel;
    let known = KNOWN_LOCAL
        .iter()
        .any(|(prefix, suffix)| name.starts_with(prefix) && name.ends_with(suffix));
    let decode = name.contains("_q8_") || name.starts_with("deltanet_step_kernel<");
    kernel.uses_local_memory() && decode && !known
}

fn main() -> ExitCode {
    let mut archs: Vec<String> = std::env::args().skip(1).collect();
    if archs.is_empty() {
        archs = vec!["sm_80".to_string(), "sm_90".to_string()];
    }
    match nvrtc_version() {
        Ok((major, minor)) => println!("NVRTC {major}.{minor}"),
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    }
    let (mut passed, mut failed) = (0, 0);
    for arch in &archs {
        let started = Instant::now();
        let results = match compile_all(arch) {
            Ok(results) => results,
            Err(error) => {
                eprintln!("error: {arch}: {error}");
                return ExitCode::FAILURE;
            }
        };
        for module in results {
            let (name, seconds) = (&module.name, module.seconds);
            // With REDLITE_NVRTC_VERBOSE=1: the kernels that touch local memory.
            // REDLITE_NVRTC_LIST=PREFIX: the resources of every kernel whose name starts so.
            if let Ok(prefix) = std::env::var("REDLITE_NVRTC_LIST") {
                for kernel in module
                    .kernels
                    .iter()
                    .filter(|k| k.kernel.starts_with(&prefix))
                {
                    println!(
                        "kernel {arch} {}: {} registers, {} bytes stack",
                        kernel.kernel, kernel.registers, kernel.stack_frame
                    );
                }
            }
            for kernel in module.kernels.iter().filter(|k| k.uses_local_memory()) {
                let refused = local_memory_refused(kernel);
                failed += usize::from(refused);
                println!(
                    "{} {arch} {}: {} registers, {} bytes stack, {} / {} bytes spilled / reloaded",
                    if refused { "LOCAL " } else { "local " },
                    kernel.kernel,
                    kernel.registers,
                    kernel.stack_frame,
                    kernel.spill_stores,
                    kernel.spill_loads
                );
            }
            match module.result {
                Ok(()) => {
                    passed += 1;
                    println!("ok     {arch} {name} ({seconds:.1} s)");
                }
                Err(log) => {
                    failed += 1;
                    println!("FAILED {arch} {name} ({seconds:.1} s)\n{log}");
                }
            }
        }
        println!("{arch}: {:.1} s", started.elapsed().as_secs_f64());
    }
    println!("compile_kernels: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
