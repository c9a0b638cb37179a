//! Compiles every kernel module with NVRTC for each architecture given (default sm_80 and
//! sm_90). Needs libnvrtc on the loader path but no GPU; the CI check runs it.
//!
//! `cargo run -p redlite-cuda --example compile_kernels -- sm_80 sm_90`

use redlite_cuda::{compile_all, nvrtc_version};
use std::process::ExitCode;
use std::time::Instant;

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
