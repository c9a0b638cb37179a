//! Writes one kernel module's full NVRTC source (prelude, tables and kernels) to a file, for
//! tools that compile it elsewhere (scripts/dev/mma-emu runs the mma kernels on the host).
//!
//! `cargo run -p redlite-cuda --example dump_module -- mma out.cu`

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [name, path] = args.as_slice() else {
        eprintln!("usage: dump_module MODULE OUT_PATH");
        return ExitCode::FAILURE;
    };
    // A large family is split into modules `NAME.0`, `NAME.1`, ... of the same source.
    let shard = format!("{name}.");
    let Some(module) = redlite_cuda::modules()
        .into_iter()
        .find(|m| m.name == *name || m.name.starts_with(&shard))
    else {
        eprintln!("no kernel module named {name}");
        return ExitCode::FAILURE;
    };
    if let Err(error) = std::fs::write(path, module.source) {
        eprintln!("{path}: {error}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
