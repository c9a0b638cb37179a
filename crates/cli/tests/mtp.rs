//! `--mtp` end to end through the binary: greedy `generate` prints the same text with and
//! without speculative decoding and reports its acceptance counts; `bench --mtp` reports
//! them too, and samples at a temperature when asked; a file without the MTP block is refused
//! with a message that says so.

use common::{redlite, text, TinyFile};
use redlite_engine::synth::Recipe;

mod common;

/// A tiny model for these tests.
fn tiny_file(name: &str, mtp: bool) -> TinyFile {
    TinyFile::new("mtp", name, Recipe::Q4KM, 3, mtp)
}

#[test]
fn greedy_generate_prints_the_same_text_with_mtp() {
    let file = tiny_file("generate", true);
    let args = ["-p", "the quick brown fox", "-n", "24", "--temp", "0"];
    let plain = redlite(&file.0, "generate", &args);
    assert!(plain.status.success(), "{}", text(&plain.stderr));
    for draft in ["1", "3"] {
        let mut with = args.to_vec();
        with.extend(["--mtp", "--draft", draft]);
        let out = redlite(&file.0, "generate", &with);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout), text(&plain.stdout), "draft {draft}");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("mtp: ") && stderr.contains("drafted"),
            "{stderr}"
        );
    }
}

#[test]
fn bench_reports_acceptance() {
    let file = tiny_file("bench", true);
    let out = redlite(
        &file.0,
        "bench",
        &[
            "-p",
            "0",
            "-n",
            "16",
            "-r",
            "1",
            "--mtp",
            "--draft",
            "2",
            "--mtp-accept",
            "1",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = json["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "plain tg and tg with MTP");
    let mtp = &results[1]["mtp"];
    assert_eq!(mtp["draft"], 2);
    assert_eq!(mtp["acceptance_rate"], 1.0);
    assert!(mtp["stats"]["drafted"].as_u64().unwrap() > 0);
}

#[test]
fn bench_samples_at_a_temperature_and_names_the_tests_so() {
    let file = tiny_file("bench-temp", true);
    let args = [
        "-p", "0", "-n", "12", "-r", "1", "--mtp", "--draft", "2", "--temp", "0.8", "--json",
    ];
    let out = redlite(&file.0, "bench", &args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tests: Vec<&str> = json["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["tg12 t0.8", "tg12 mtp2 t0.8"]);
    let bad = redlite(&file.0, "bench", &["-p", "0", "-n", "4", "--temp=-1"]);
    assert!(!bad.status.success());
    assert!(
        text(&bad.stderr).contains("temperature"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn a_file_without_the_mtp_block_is_refused() {
    let file = tiny_file("none", false);
    for command in ["generate", "bench"] {
        let args: &[&str] = if command == "generate" {
            &["-p", "hi", "-n", "2", "--mtp"]
        } else {
            &["-p", "0", "-n", "2", "--mtp"]
        };
        let out = redlite(&file.0, command, args);
        assert!(!out.status.success(), "{command} ran without the MTP block");
        let stderr = text(&out.stderr);
        assert!(
            stderr.contains("--mtp needs the model's MTP block")
                && stderr.contains("nextn_predict_layers"),
            "{command}: {stderr}"
        );
    }
}

#[test]
fn too_many_drafts_are_refused() {
    let file = tiny_file("draft4", true);
    let out = redlite(&file.0, "generate", &["-p", "hi", "--mtp", "--draft", "4"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--draft must be 1 to 3"),
        "{}",
        text(&out.stderr)
    );
}
