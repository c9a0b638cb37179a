//! `redlite synth` files: deterministic, read back with the config they were written from,
//! and filled with weights of the intended size and zero mean.

use redlite_engine::model::load::config_from_gguf;
use redlite_engine::model::{DeltaNetLayout, HybridConfig, Role};
use redlite_engine::synth::{plan_tensors, write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::GgufModel;
use sha2::{Digest, Sha256};

fn options(recipe: Recipe, layout: DeltaNetLayout, mtp: bool) -> SynthOptions {
    let mut config = Preset::Tiny.config();
    config.layout = layout;
    config.n_mtp = usize::from(mtp);
    SynthOptions {
        config,
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 7,
    }
}

fn write(dir: &std::path::Path, name: &str, opts: &SynthOptions) -> std::path::PathBuf {
    let path = dir.join(name);
    write_synth(&path, opts, &mut |_, _| {}).unwrap();
    path
}

fn sha256(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The same options give the same bytes whatever the thread count; these digests pin the
/// bytes across machines (a change to the generator must update them on purpose).
#[test]
fn same_options_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("F32", options(Recipe::F32, DeltaNetLayout::Split, false)),
        (
            "IQ2_XXS",
            options(Recipe::IQ2XXS, DeltaNetLayout::Split, false),
        ),
        (
            "IQ1_M-legacy",
            options(Recipe::IQ1M, DeltaNetLayout::Legacy, false),
        ),
        (
            "Q4_K_M-mtp",
            options(Recipe::Q4KM, DeltaNetLayout::Split, true),
        ),
    ];
    let mut digests = Vec::new();
    for (name, opts) in &cases {
        let a = write(dir.path(), &format!("{name}-a.gguf"), opts);
        let single = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        let b = single.install(|| write(dir.path(), &format!("{name}-b.gguf"), opts));
        assert_eq!(
            sha256(&a),
            sha256(&b),
            "{name}: thread count changed the bytes"
        );
        digests.push(format!("{name} {}", sha256(&a)));
    }
    let pinned = include_str!("fixtures/synth_sha256.txt");
    let pinned: Vec<&str> = pinned.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(digests, pinned, "synthetic file bytes changed");
}

#[test]
fn config_reads_back() {
    let dir = tempfile::tempdir().unwrap();
    for (layout, mtp) in [
        (DeltaNetLayout::Split, false),
        (DeltaNetLayout::Legacy, false),
        (DeltaNetLayout::Split, true),
    ] {
        let opts = options(Recipe::IQ2XS, layout, mtp);
        let path = write(dir.path(), "model.gguf", &opts);
        let model = GgufModel::open(&path).unwrap();
        let config = config_from_gguf(&model).unwrap();
        assert_eq!(config, opts.config, "{layout:?} mtp={mtp}");
    }
}

#[test]
fn full_preset_has_the_real_tensor_counts() {
    // Spec §2.4: 843 tensors in the split layout, 807 in the legacy one; MTP adds block 48.
    let mut c: HybridConfig = Preset::Full.config();
    assert_eq!(plan_tensors(&c, Recipe::IQ2XXS).len(), 843);
    c.layout = DeltaNetLayout::Legacy;
    assert_eq!(plan_tensors(&c, Recipe::IQ2XXS).len(), 807);
    // Q4_K_M on the legacy layout: the histogram of a real lmstudio-community file.
    let types = plan_tensors(&c, Recipe::Q4KM);
    let count = |name: &str| types.iter().filter(|(_, t)| t.name() == name).count();
    assert_eq!(
        (count("F32"), count("F16"), count("Q4_K"), count("Q6_K")),
        (313, 48, 391, 55)
    );
    let params: u64 = types
        .iter()
        .map(|(p, _)| p.shape.iter().product::<u64>())
        .sum();
    assert_eq!(params, 79_674_391_296);
}

#[test]
fn quantized_weights_are_zero_mean_and_sized() {
    let dir = tempfile::tempdir().unwrap();
    for recipe in [Recipe::IQ2XXS, Recipe::IQ1M, Recipe::Q4KM] {
        let opts = options(recipe, DeltaNetLayout::Split, false);
        let path = write(dir.path(), "model.gguf", &opts);
        let model = GgufModel::open(&path).unwrap();
        for (plan, ty) in plan_tensors(&opts.config, recipe) {
            if !ty.is_quantized() || plan.role == Role::TokenEmbd {
                continue;
            }
            let info = model.require(&plan.name).unwrap();
            let mut values = vec![0f32; info.elements() as usize];
            redlite_quant::dequantize_row(ty, model.tensor_data(&plan.name).unwrap(), &mut values)
                .unwrap();
            let n = values.len() as f64;
            let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
            let std = (values
                .iter()
                .map(|&v| (f64::from(v) - mean).powi(2))
                .sum::<f64>()
                / n)
                .sqrt();
            let target = 1.28 / (info.row_len() as f64).sqrt();
            let want = match plan.role {
                Role::Output => 4.0 / (info.row_len() as f64).sqrt(),
                Role::SsmOut | Role::AttnOutput | Role::ExpertDown | Role::SharedDown => {
                    target / 4.0
                }
                _ => target,
            };
            assert!(
                (std / want - 1.0).abs() < 0.25,
                "{} ({ty}): std {std:.4}, wanted {want:.4}",
                plan.name
            );
            assert!(
                mean.abs() < 0.1 * want,
                "{} ({ty}): mean {mean:.5} vs std {want:.4}",
                plan.name
            );
        }
    }
}

#[test]
fn a_file_that_disagrees_with_its_metadata_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(Recipe::F32, DeltaNetLayout::Split, false);
    let path = write(dir.path(), "good.gguf", &opts);
    // Same tensors, but metadata claiming 32 experts: every expert tensor disagrees with it.
    let model = GgufModel::open(&path).unwrap();
    let mut md = model.metadata().clone();
    md.set("qwen3next.expert_count", redlite_gguf::Value::U32(32));
    let tensors: Vec<(redlite_gguf::TensorSpec, Vec<u8>)> = model
        .tensors()
        .map(|t| {
            (
                redlite_gguf::TensorSpec::new(t.name.clone(), t.ty, &t.shape),
                model.tensor_data(&t.name).unwrap().to_vec(),
            )
        })
        .collect();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, redlite_gguf::write_to_vec(&md, &tensors).unwrap()).unwrap();
    let err = config_from_gguf(&GgufModel::open(&bad).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("blk.0.ffn_gate_inp.weight")
            && err.contains("[32, 256]")
            && err.contains("[16, 256]"),
        "{err}"
    );

    md.set(
        "general.architecture",
        redlite_gguf::Value::String("llama".into()),
    );
    std::fs::write(&bad, redlite_gguf::write_to_vec(&md, &tensors).unwrap()).unwrap();
    let err = config_from_gguf(&GgufModel::open(&bad).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("\"llama\""), "{err}");
}
