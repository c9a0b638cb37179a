//! `redlite plan` end to end: it reads only the tensor table, prints the plan, and its exit
//! status says whether the plan fits.

use std::path::Path;
use std::process::Output;

use common::{redlite, text, TinyFile};
use redlite_engine::synth::Recipe;

mod common;

/// A tiny model for these tests.
fn tiny_file(name: &str, mtp: bool) -> TinyFile {
    TinyFile::new("plan", name, Recipe::IQ2XXS, 1, mtp)
}

fn plan(file: &Path, args: &[&str]) -> Output {
    redlite(file, "plan", args)
}

#[test]
fn a_plan_that_fits_exits_zero() {
    let file = tiny_file("fits", false);
    let out = plan(&file.0, &["--gpu-limit", "2GiB", "--kv", "f16"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("verdict   fits: experts all resident"),
        "{stdout}"
    );
    assert!(stdout.contains("KV f16"), "{stdout}");
}

#[test]
fn a_plan_that_does_not_fit_exits_non_zero_with_advice() {
    let file = tiny_file("tight", false);
    let out = plan(&file.0, &["--gpu-limit", "964MiB", "--ctx", "200000"]);
    assert!(!out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.contains("does NOT fit"), "{stdout}");
    assert!(stdout.contains("advice    to fit: --kv f16"), "{stdout}");
    assert!(text(&out.stderr).contains("the limit is 964.0 MiB"));
}

#[test]
fn json_for_scripts() {
    let file = tiny_file("json", true);
    let out = plan(&file.0, &["--gpu-limit", "1G", "--mtp", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["fits"], true);
    assert_eq!(json["settings"]["mtp"], true);
    assert_eq!(json["settings"]["gpu_limit"], 1u64 << 30);
    assert!(json["budget"]["mtp_weights"].as_u64().unwrap() > 0);
}

#[test]
fn bad_input_is_named() {
    let file = tiny_file("bad", false);
    let out = plan(&file.0, &["--gpu-limit", "24XB"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("\"24XB\" is not a byte size"));
    let out = plan(&file.0, &["--gpu-limit", "24GiB", "--mtp"]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("the file has none"));
    let out = plan(&file.0, &["--gpu-limit", "24GiB", "--experts", "most"]);
    assert!(text(&out.stderr).contains("--experts is most"));
}

#[test]
fn a_gpu_run_that_does_not_fit_is_refused_before_loading() {
    let file = tiny_file("run-tight", false);
    // 700 MiB is less than the CUDA reserve the plan counts: refused before any weight is
    // read (the same with or without a CUDA build).
    let args: Vec<&str> = "-p x -n 1 --device cuda --gpu-limit 700MiB"
        .split(' ')
        .collect();
    let out = redlite(&file.0, "generate", &args);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    let refused = "the run does not fit in 700MiB";
    assert!(stderr.contains(refused), "{stderr}");
    // A cache below the router's top-k is refused too.
    let args: Vec<&str> = "-p x -n 1 --device cuda --experts cache=1KiB"
        .split(' ')
        .collect();
    let out = redlite(&file.0, "generate", &args);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("below the minimum"), "{stderr}");
}
