//! The memory planner on the full 80B-A3B shapes (no file needed: shapes and recipe types
//! give every byte), checked against real synthetic files for the parts that can be.

use redlite_engine::model::DeltaNetLayout;
use redlite_engine::plan::{
    evaluate, plan, plan_file, Change, ExpertPolicy, Goal, ModelShape, PlanError, PlanSettings,
    Residency, GIB, MIB,
};
use redlite_engine::state::KvType;
use redlite_engine::synth::{plan_tensors, write_synth, Preset, Recipe, SynthOptions, VocabChoice};
use redlite_gguf::{write_to_vec, GgufModel, Metadata, TensorSpec, Value};

use KvType::{F16, F32};

/// The 80B-A3B with its MTP block (plans without `mtp` do not count it).
fn full(recipe: Recipe) -> ModelShape {
    let mut config = Preset::Full.config();
    config.n_mtp = 1;
    ModelShape::from_recipe(&config, recipe).unwrap()
}

const IQ2: Recipe = Recipe::IQ2XXS;
const Q4: Recipe = Recipe::Q4KM;
const RESIDENT: Residency = Residency::Resident;

const fn cache(slots_per_layer: u64) -> Residency {
    Residency::Cache { slots_per_layer }
}

type Row = (
    Recipe,
    u64,
    KvType,
    usize,
    bool,
    bool,
    Residency,
    i64,
    Option<usize>,
    Option<usize>,
    Option<usize>,
);

/// recipe, GiB, KV, chunk, MTP → fits, residency, remaining bytes, largest context with all
/// experts resident / with an expert cache / at all. ctx 4096, one slot, `--experts auto`.
#[rustfmt::skip]
const OUTCOMES: [Row; 48] = [
    (IQ2, 16, F32, 512, false, true, cache(376), 17_742_036, None, Some(262_144), Some(262_144)),
    (IQ2, 16, F32, 512, true, true, cache(365), 7_332_264, None, Some(262_144), Some(262_144)),
    (IQ2, 16, F32, 2048, false, true, cache(365), 38_195_412, None, Some(262_144), Some(262_144)),
    (IQ2, 16, F32, 2048, true, true, cache(352), 15_964_584, None, Some(261_053), Some(262_144)),
    (IQ2, 16, F16, 512, false, true, cache(379), 956_628, None, Some(262_144), Some(262_144)),
    (IQ2, 16, F16, 512, true, true, cache(367), 36_463_016, None, Some(262_144), Some(262_144)),
    (IQ2, 16, F16, 2048, false, true, cache(368), 21_410_004, None, Some(262_144), Some(262_144)),
    (IQ2, 16, F16, 2048, true, true, cache(355), 5_134_760, None, Some(262_144), Some(262_144)),
    (IQ2, 24, F32, 512, false, true, RESIDENT, 3_283_335_380, Some(70_895), Some(262_144), Some(262_144)),
    (IQ2, 24, F32, 512, true, true, RESIDENT, 2_723_062_184, Some(55_235), Some(262_144), Some(262_144)),
    (IQ2, 24, F32, 2048, false, true, RESIDENT, 2_873_143_508, Some(62_550), Some(262_144), Some(262_144)),
    (IQ2, 24, F32, 2048, true, true, RESIDENT, 2_212_207_016, Some(45_641), Some(262_144), Some(262_144)),
    (IQ2, 24, F16, 512, false, true, RESIDENT, 3_383_998_676, Some(141_791), Some(262_144), Some(262_144)),
    (IQ2, 24, F16, 512, true, true, RESIDENT, 2_832_114_088, Some(110_470), Some(262_144), Some(262_144)),
    (IQ2, 24, F16, 2048, false, true, RESIDENT, 2_973_806_804, Some(125_100), Some(262_144), Some(262_144)),
    (IQ2, 24, F16, 2048, true, true, RESIDENT, 2_321_258_920, Some(91_282), Some(262_144), Some(262_144)),
    (IQ2, 32, F32, 512, false, true, RESIDENT, 11_873_269_972, Some(245_658), Some(262_144), Some(262_144)),
    (IQ2, 32, F32, 512, true, true, RESIDENT, 11_312_996_776, Some(216_554), Some(262_144), Some(262_144)),
    (IQ2, 32, F32, 2048, false, true, RESIDENT, 11_463_078_100, Some(237_312), Some(262_144), Some(262_144)),
    (IQ2, 32, F32, 2048, true, true, RESIDENT, 10_802_141_608, Some(206_960), Some(262_144), Some(262_144)),
    (IQ2, 32, F16, 512, false, true, RESIDENT, 11_973_933_268, Some(262_144), Some(262_144), Some(262_144)),
    (IQ2, 32, F16, 512, true, true, RESIDENT, 11_422_048_680, Some(262_144), Some(262_144), Some(262_144)),
    (IQ2, 32, F16, 2048, false, true, RESIDENT, 11_563_741_396, Some(262_144), Some(262_144), Some(262_144)),
    (IQ2, 32, F16, 2048, true, true, RESIDENT, 10_911_193_512, Some(262_144), Some(262_144), Some(262_144)),
    (Q4, 16, F32, 512, false, true, cache(156), 26_575_060, None, Some(262_144), Some(262_144)),
    (Q4, 16, F32, 512, true, true, cache(151), 59_689_384, None, Some(251_988), Some(262_144)),
    (Q4, 16, F32, 2048, false, true, cache(151), 73_496_788, None, Some(262_144), Some(262_144)),
    (Q4, 16, F32, 2048, true, true, cache(146), 14_795_176, None, Some(242_394), Some(259_896)),
    (Q4, 16, F16, 512, false, true, cache(157), 35_815_636, None, Some(262_144), Some(262_144)),
    (Q4, 16, F16, 512, true, true, cache(152), 75_549_096, None, Some(262_144), Some(262_144)),
    (Q4, 16, F16, 2048, false, true, cache(152), 82_737_364, None, Some(262_144), Some(262_144)),
    (Q4, 16, F16, 2048, true, true, cache(147), 30_654_888, None, Some(262_144), Some(262_144)),
    (Q4, 24, F32, 512, false, true, cache(250), 22_773_972, None, Some(262_144), Some(262_144)),
    (Q4, 24, F32, 512, true, true, cache(243), 75_942_312, None, Some(262_144), Some(262_144)),
    (Q4, 24, F32, 2048, false, true, cache(245), 69_695_700, None, Some(262_144), Some(262_144)),
    (Q4, 24, F32, 2048, true, true, cache(238), 31_048_104, None, Some(262_144), Some(262_144)),
    (Q4, 24, F16, 512, false, true, cache(251), 32_014_548, None, Some(262_144), Some(262_144)),
    (Q4, 24, F16, 512, true, true, cache(244), 91_802_024, None, Some(262_144), Some(262_144)),
    (Q4, 24, F16, 2048, false, true, cache(246), 78_936_276, None, Some(262_144), Some(262_144)),
    (Q4, 24, F16, 2048, true, true, cache(239), 46_907_816, None, Some(262_144), Some(262_144)),
    (Q4, 32, F32, 512, false, true, cache(344), 18_972_884, None, Some(262_144), Some(262_144)),
    (Q4, 32, F32, 512, true, true, cache(335), 92_195_240, None, Some(262_144), Some(262_144)),
    (Q4, 32, F32, 2048, false, true, cache(339), 65_894_612, None, Some(262_144), Some(262_144)),
    (Q4, 32, F32, 2048, true, true, cache(330), 47_301_032, None, Some(262_144), Some(262_144)),
    (Q4, 32, F16, 512, false, true, cache(345), 28_213_460, None, Some(262_144), Some(262_144)),
    (Q4, 32, F16, 512, true, true, cache(337), 14_862_760, None, Some(262_144), Some(262_144)),
    (Q4, 32, F16, 2048, false, true, cache(340), 75_135_188, None, Some(262_144), Some(262_144)),
    (Q4, 32, F16, 2048, true, true, cache(331), 63_160_744, None, Some(262_144), Some(262_144)),
];

#[test]
fn outcomes_of_the_full_model_are_pinned() {
    let shapes = [(IQ2, full(IQ2)), (Q4, full(Q4))];
    // Every case is compared; a change prints the whole table as it now is, for review.
    let mut differ = Vec::new();
    let mut table = String::new();
    for (recipe, gib, kv, chunk, mtp, fits, residency, remaining, resident, cached, any) in OUTCOMES
    {
        let shape = &shapes.iter().find(|(r, _)| *r == recipe).unwrap().1;
        let settings = PlanSettings {
            kv,
            chunk,
            mtp,
            ..PlanSettings::new(gib * GIB)
        };
        let p = plan(shape, &settings).unwrap();
        let case = format!("{recipe:?} {gib} GiB {kv:?} chunk {chunk} mtp {mtp}");
        let got = (
            p.fits,
            p.experts.residency,
            p.remaining,
            p.largest_context.all_resident,
            p.largest_context.with_cache,
            p.largest_context.at_all,
        );
        if got != (fits, residency, remaining, resident, cached, any) {
            differ.push(case.clone());
        }
        let residency_src = match got.1 {
            Residency::Cache { slots_per_layer } => format!("cache({slots_per_layer})"),
            other => format!("{other:?}").to_uppercase(),
        };
        let remaining_src = group_digits(got.2);
        let ctx_src = |c: Option<usize>| {
            c.map_or("None".into(), |c| {
                format!("Some({})", group_digits(c as i64))
            })
        };
        let name = if recipe == IQ2 { "IQ2" } else { "Q4" };
        table += &format!(
            "    ({name}, {gib}, {kv:?}, {chunk}, {mtp}, {}, {residency_src}, {remaining_src}, {}, {}, {}),\n",
            got.0,
            ctx_src(got.3),
            ctx_src(got.4),
            ctx_src(got.5)
        );
        // A cache takes every whole slot set that fits: less than one more is left.
        if let Residency::Cache { slots_per_layer } = p.experts.residency {
            let pool = &p.experts.pool;
            assert_eq!(
                p.experts.gpu_bytes,
                slots_per_layer * pool.slot_set,
                "{case}"
            );
            assert!((p.remaining as u64) < pool.slot_set, "{case}");
            assert!(slots_per_layer >= pool.min_cache_slots, "{case}");
        }
        assert_eq!(p.used as i64 + p.remaining, (gib * GIB) as i64, "{case}");
    }
    assert!(
        differ.is_empty(),
        "{} outcomes changed: {}\nthe table as it now is:\n{table}",
        differ.len(),
        differ.join(", ")
    );
}

/// `1234567` as `1_234_567` (how the table writes numbers).
fn group_digits(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push('_');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

#[test]
fn weight_totals_match_the_files() {
    // Without the MTP block, as community files and `redlite synth --preset full` have it.
    let iq2 = ModelShape::from_recipe(&Preset::Full.config(), IQ2).unwrap();
    let q4 = ModelShape::from_recipe(&Preset::Full.config(), Q4).unwrap();
    // The full IQ2_XXS synthetic file is 19.74 GiB: these tensors plus a ~6 MB header
    // (vocabulary and merges) and alignment.
    assert_eq!(iq2.tensor_bytes, 21_191_691_264);
    let gib = iq2.tensor_bytes as f64 / GIB as f64;
    assert!((19.73..19.74).contains(&gib), "{gib}");
    // A real Q4_K_M file of this model holds 45.08 GiB (spec §6.1).
    assert_eq!(q4.tensor_bytes, 48_405_005_312);
    assert!((q4.tensor_bytes as f64 / GIB as f64 - 45.08).abs() < 0.005);
    // Every tensor of these recipes is uploaded as stored (vectors are already f32).
    for shape in [&iq2, &q4] {
        assert_eq!(
            shape.dense.total() + shape.expert_bytes(),
            shape.tensor_bytes
        );
    }
    assert_eq!(iq2.expert_bytes(), 20_044_578_816);
    assert_eq!(iq2.dense.token_embd, 102_100_992); // Q2_K
    assert_eq!(iq2.dense.output, 213_925_888); // Q5_K
    assert_eq!(q4.expert_bytes(), 46_808_432_640);
    // One expert: gate + up + down; the down stacks of layers 0-2 are Q2_K in IQ2_XXS, half of
    // them Q6_K in Q4_K_M.
    assert_eq!(iq2.experts[0].per_expert, 2 * 270_336 + 344_064);
    assert_eq!(iq2.experts[47].per_expert, 3 * 270_336);
    assert_eq!(q4.experts[0].per_expert, 2 * 589_824 + 860_160);
    assert_eq!(q4.experts[7].per_expert, 3 * 589_824);
}

#[test]
fn state_lines_follow_the_spec() {
    let shape = full(IQ2);
    let at = |kv, mtp| {
        evaluate(
            &shape,
            &PlanSettings {
                kv,
                mtp,
                ..PlanSettings::new(24 * GIB)
            },
        )
        .budget
    };
    let b = at(F32, false);
    assert_eq!(b.kv_bytes_per_position, 48 * 1024); // 12 layers x K,V x 2 x 256 x 4 B
    assert_eq!(at(F16, false).kv_bytes_per_position, 24 * 1024);
    assert_eq!(at(F32, true).kv_bytes_per_position, 52 * 1024); // + the MTP layer
    assert_eq!(b.kv_cache, 4096 * 48 * 1024);
    assert_eq!(b.deltanet_state_per_slot, 79_036_416); // 75.4 MiB (spec §3.6)
    assert_eq!(b.deltanet_state_positions, 1608);
    assert_eq!(at(F16, false).deltanet_state_positions, 3216);
    assert_eq!(b.activations.rows, 513);
    assert_eq!(
        b.activations.total(),
        // Rows, partials, Q8_K codes (workspace, mixer output), logits.
        513 * 267_052 + 4 * 1_056_768 + 3 * 16 * 2080 + 16 * 4160 + 607_744
    );
    assert_eq!(b.cuda_context + b.cuda_workspace, 832 * MIB);
}

fn tiny_options(recipe: Recipe, mtp: bool, layout: DeltaNetLayout) -> SynthOptions {
    let mut config = Preset::Tiny.config();
    config.n_mtp = usize::from(mtp);
    config.layout = layout;
    SynthOptions {
        config,
        recipe,
        vocab: VocabChoice::Tiny,
        seed: 3,
    }
}

/// The planner's bytes, from shapes alone, are the bytes of a written file's tensor table.
#[test]
fn shapes_agree_with_a_written_file() {
    let dir = tempfile::tempdir().unwrap();
    for (recipe, mtp, layout) in [
        (IQ2, false, DeltaNetLayout::Split),
        (Q4, true, DeltaNetLayout::Split),
        (Recipe::F16, false, DeltaNetLayout::Split),
        (Recipe::IQ1M, false, DeltaNetLayout::Legacy),
    ] {
        let opts = tiny_options(recipe, mtp, layout);
        let path = dir.path().join(format!("{recipe:?}-{mtp}-{layout:?}.gguf"));
        write_synth(&path, &opts, &mut |_, _| {}).unwrap();
        let model = GgufModel::open(&path).unwrap();
        let from_file = ModelShape::from_gguf(&model).unwrap();
        let from_shapes = ModelShape::from_recipe(&opts.config, recipe).unwrap();
        assert_eq!(from_file, from_shapes, "{recipe:?}");
        let table: u64 = model.tensors().map(|t| t.bytes).sum();
        assert_eq!(from_file.tensor_bytes, table);
        let mtp_bytes = from_file
            .mtp
            .as_ref()
            .map_or(0, |m| m.dense + m.experts.bytes);
        assert_eq!(
            from_file.dense.total() + from_file.expert_bytes() + mtp_bytes,
            table
        );
        assert_eq!(from_file.mtp.is_some(), mtp);
        let settings = PlanSettings {
            mtp,
            ..PlanSettings::new(GIB)
        };
        assert_eq!(
            plan_file(&model, &settings).unwrap(),
            plan(&from_shapes, &settings).unwrap()
        );
    }
}

/// Without `output.weight` the loader uploads the embedding a second time as the head.
#[test]
fn a_tied_head_is_counted_twice() {
    let config = Preset::Tiny.config();
    let mut md = Metadata::new();
    md.set("general.architecture", Value::String("qwen3next".into()));
    config.write_metadata(&mut md, true);
    let tensors: Vec<(TensorSpec, Vec<u8>)> = plan_tensors(&config, Recipe::F16)
        .into_iter()
        .filter(|(p, _)| p.name != "output.weight")
        .map(|(p, ty)| {
            let spec = TensorSpec::new(p.name, ty, &p.shape);
            let bytes = redlite_engine::plan::stored_bytes(&spec.name, ty, &spec.shape).unwrap();
            (spec, vec![0u8; bytes as usize])
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tied.gguf");
    std::fs::write(&path, write_to_vec(&md, &tensors).unwrap()).unwrap();
    let shape = ModelShape::from_gguf(&GgufModel::open(&path).unwrap()).unwrap();
    assert!(shape.dense.token_embd > 0);
    assert_eq!(shape.dense.output, shape.dense.token_embd);
}

#[test]
fn mtp_is_counted_only_when_asked_and_present() {
    let without_block = ModelShape::from_recipe(&Preset::Full.config(), IQ2).unwrap();
    let with_block = full(IQ2);
    let settings = PlanSettings::new(24 * GIB);
    let a = plan(&without_block, &settings).unwrap();
    let b = plan(&with_block, &settings).unwrap();
    assert_eq!(
        (a.budget, a.experts, a.largest_context),
        (b.budget, b.experts, b.largest_context)
    );
    let asked = PlanSettings {
        mtp: true,
        ..settings
    };
    assert!(matches!(
        plan(&without_block, &asked),
        Err(PlanError::NoMtpBlock)
    ));
    let p = plan(&with_block, &asked).unwrap();
    assert_eq!(p.budget.mtp_weights, 14_563_328);
    assert_eq!(p.experts.pool.moe_layers, 49);
    assert_eq!(p.budget.activations.logit_rows, 2);
    // A verification records the DeltaNet state after each draft's row (one with one
    // draft); each drafted token is a row.
    assert_eq!(p.budget.deltanet_copies, 2);
    assert_eq!(p.budget.deltanet_state, 2 * 79_036_416);
    let three = plan(
        &with_block,
        &PlanSettings {
            draft: 3,
            ..asked.clone()
        },
    )
    .unwrap();
    assert_eq!(three.budget.activations.logit_rows, 4);
    assert_eq!(three.budget.activations.rows, 512 + 4);
    assert_eq!(three.budget.deltanet_copies, 4);
    assert!(plan(&with_block, &PlanSettings { draft: 4, ..asked }).is_err());
}

#[test]
fn policies() {
    let shape = full(Q4);
    let at = |experts| {
        plan(
            &shape,
            &PlanSettings {
                experts,
                ..PlanSettings::new(32 * GIB)
            },
        )
        .unwrap()
    };
    let cpu = at(ExpertPolicy::Cpu);
    assert!(cpu.fits);
    assert_eq!(cpu.experts.gpu_bytes, 0);
    assert_eq!(cpu.experts.host_bytes, shape.expert_bytes());
    let resident = at(ExpertPolicy::Resident);
    assert!(!resident.fits);
    let ten_gib = at(ExpertPolicy::Cache(10 * GIB));
    assert!(ten_gib.fits);
    let slot_set = ten_gib.experts.pool.slot_set;
    assert_eq!(ten_gib.experts.residency, cache(10 * GIB / slot_set));
    let tiny_cache = at(ExpertPolicy::Cache(100 * MIB));
    assert!(!tiny_cache.fits);
    assert!(tiny_cache
        .experts
        .problem
        .unwrap()
        .contains("minimum of 10"));
    assert_eq!(
        at(ExpertPolicy::Cache(64 * GIB)).experts.residency,
        RESIDENT
    );
}

/// The largest context fits and one more position does not.
#[test]
fn largest_context_is_the_boundary() {
    let shape = full(IQ2);
    let settings = PlanSettings::new(24 * GIB);
    let p = plan(&shape, &settings).unwrap();
    let largest = p.largest_context.all_resident.unwrap();
    assert_eq!(largest, 70_895);
    let at = |ctx| {
        evaluate(
            &shape,
            &PlanSettings {
                ctx,
                ..settings.clone()
            },
        )
        .experts
        .residency
    };
    assert_eq!(at(largest), RESIDENT);
    assert_ne!(at(largest + 1), RESIDENT);
}

fn advice_of(shape: &ModelShape, settings: &PlanSettings) -> (Vec<Change>, Goal) {
    let advice = plan(shape, settings).unwrap().advice.unwrap();
    (advice.changes, advice.goal)
}

/// Applies the advice's flags to the settings.
fn apply(settings: &PlanSettings, changes: &[Change]) -> PlanSettings {
    let mut s = settings.clone();
    for change in changes {
        match *change {
            Change::KvF16 => s.kv = F16,
            Change::Chunk(n) => s.chunk = n,
            Change::Slots(n) => s.slots = n,
            Change::Experts(p) => s.experts = p,
            Change::Ctx(n) => s.ctx = n,
        }
    }
    s
}

#[test]
fn advice_follows_the_rule() {
    let iq2 = full(IQ2);
    let q4 = full(Q4);
    // f16 KV alone keeps every expert resident.
    let s = PlanSettings {
        ctx: 32_768,
        ..PlanSettings::new(22 * GIB)
    };
    assert_eq!(
        advice_of(&iq2, &s),
        (vec![Change::KvF16], Goal::AllResident)
    );
    // `--experts resident` on 16 GiB: the cache that fits, alone (cheaper changes do not
    // make residency fit).
    let s = PlanSettings {
        experts: ExpertPolicy::Resident,
        ..PlanSettings::new(16 * GIB)
    };
    let (changes, goal) = advice_of(&iq2, &s);
    assert_eq!(goal, Goal::Fit);
    assert!(matches!(
        changes[..],
        [Change::Experts(ExpertPolicy::Cache(_))]
    ));
    // Four slots of the full context on 24 GiB: fewer slots.
    let s = PlanSettings {
        ctx: 262_144,
        slots: 4,
        ..PlanSettings::new(24 * GIB)
    };
    assert_eq!(advice_of(&q4, &s), (vec![Change::Slots(1)], Goal::Fit));
    // 1 GiB: the dense weights alone exceed it; nothing but a larger GPU helps.
    let p = plan(&q4, &PlanSettings::new(GIB)).unwrap();
    assert!(!p.fits);
    assert!(p.advice.unwrap().changes.is_empty());
    // A plan that fits with every expert resident gets no advice.
    assert!(plan(&iq2, &PlanSettings::new(32 * GIB))
        .unwrap()
        .advice
        .is_none());
}

/// Whatever the advice says makes the plan fit (or keeps the experts resident).
#[test]
fn advice_works_when_applied() {
    for shape in [full(IQ2), full(Q4)] {
        for gib in [2, 4, 8, 12, 16, 20, 22, 24, 32] {
            for (ctx, slots, chunk) in [(4096, 1, 512), (65_536, 2, 2048), (262_144, 8, 1024)] {
                for experts in [ExpertPolicy::Auto, ExpertPolicy::Resident] {
                    let s = PlanSettings {
                        ctx,
                        slots,
                        chunk,
                        experts,
                        ..PlanSettings::new(gib * GIB)
                    };
                    let p = plan(&shape, &s).unwrap();
                    let Some(advice) = p.advice else { continue };
                    if advice.changes.is_empty() {
                        assert!(!p.fits);
                        continue;
                    }
                    let after = plan(&shape, &apply(&s, &advice.changes)).unwrap();
                    assert!(after.fits, "{s:?} + {:?}", advice.changes);
                    if advice.goal == Goal::AllResident {
                        assert_eq!(after.experts.residency, RESIDENT);
                    }
                    assert_eq!(Some(after.experts.residency), advice.residency);
                }
            }
        }
    }
}

#[test]
fn settings_are_checked() {
    let shape = full(IQ2);
    for bad in [
        PlanSettings {
            ctx: 0,
            ..PlanSettings::new(GIB)
        },
        PlanSettings {
            chunk: 0,
            ..PlanSettings::new(GIB)
        },
        PlanSettings {
            slots: 0,
            ..PlanSettings::new(GIB)
        },
        PlanSettings::new(0),
    ] {
        assert!(matches!(
            plan(&shape, &bad),
            Err(PlanError::BadSetting { .. })
        ));
    }
    assert!(ExpertPolicy::parse("cache=12GiB").is_ok());
    assert!(ExpertPolicy::parse("sometimes").is_err());
}

#[test]
fn json_has_every_line() {
    let p = plan(&full(IQ2), &PlanSettings::new(16 * GIB)).unwrap();
    let json = serde_json::to_value(&p).unwrap();
    assert_eq!(json["settings"]["kv"], "f32");
    assert_eq!(json["experts"]["residency"]["kind"], "cache");
    assert_eq!(json["budget"]["deltanet_state_positions"], 1608);
    let text = p.to_string();
    for line in [
        "dense weights",
        "KV cache",
        "DeltaNet state",
        "activations",
        "CUDA context",
        "routed experts",
        "remaining",
        "verdict",
        "largest context",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[test]
fn a_slot_set_is_one_expert_of_every_layer() {
    let pool = |recipe| {
        plan(&full(recipe), &PlanSettings::new(16 * GIB))
            .unwrap()
            .experts
            .pool
    };
    // Down stacks: Q2_K in layers 0-2 (the first six ffn_down tensors, shared ones counted).
    assert_eq!(pool(IQ2).slot_set, 3 * 884_736 + 45 * 811_008);
    assert_eq!(pool(Q4).slot_set, 24 * 2_039_808 + 24 * 1_769_472);
}
