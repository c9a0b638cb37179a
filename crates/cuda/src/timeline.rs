//! `REDLITE_TIMELINE=1` (a measurement option, part of the kernel cache key): a timeline of
//! the launches, graph replays included, which neither Nsight (it serializes the launches) nor
//! the probes (they empty whole kernel families) give. Every kernel's `pdl_begin` then has
//! thread 0 of its first CTA record, in its module's ring of `TIMELINE_RECORDS` (common.cuh),
//! the global clock when it reaches its wait and when the wait returns, the grid's CTAs, the
//! CTA's threads and the kernel's name (the calling function's, or the one a lambda passes to
//! `pdl_begin_as`). When the device is dropped the rings are read, merged by time and
//! summarized per kernel (name, CTAs, threads):
//!
//! - `launches/step`: launches in the window over its steps (the last [`STEPS`] whole steps;
//!   a run of the LM head's pieces ends a step: see [`STEP_MARKER`], and [`VERIFY_MARKER`]
//!   for speculative steps);
//! - `share µs/step`: the time from its release to the next release of any kernel, attributed
//!   to it (in a chain, the time it alone held the critical path after the kernel before it
//!   ended; the gaps between steps, when the GPU idles for the host, fall to a step's last
//!   kernel; of kernels released together on parallel lanes, a mixer's products, the one
//!   released last gets the time to the join, so read such a group's shares as one);
//! - `early µs`: how long before its release its first CTA was resident and waiting (what
//!   programmatic dependent launch overlapped; ~0 where its CTAs could not start beside the
//!   kernel before it).
//!
//! The window lies where every module's ring still holds all its records. The clock is
//! `%globaltimer`, whose resolution depends on the GPU (means over many steps smooth it).
//! The extra registers of the two clock reads may change a kernel's occupancy: a timeline
//! measures a slightly different build than the default one.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaModule, CudaStream};

/// Whether `REDLITE_TIMELINE=1` is set.
pub(crate) fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_TIMELINE").as_deref() == Ok("1"))
}

/// `TIMELINE_RECORDS` and `TIMELINE_NAME` of common.cuh.
const RECORDS: usize = 32_768;
const NAME: usize = 24;
/// Bytes of a `TimelineRecord`: two u64 clocks, two u32 counts, the name.
const RECORD_BYTES: usize = 8 + 8 + 4 + 4 + NAME;

/// The kernel whose launches count the steps: the LM head's pieces (a one-token step's
/// logits in `REDLITE_LOGITS_PIECES` launches, one after the other) are the only one-token
/// products with this many CTAs or more (37,984 rows a piece for Qwen3-Next at 8 rows a CTA;
/// the other products have at most 8,192 rows). A run of them is one step.
const STEP_MARKER_MIN_CTAS: u32 = 4_096;
/// Its function's name.
const STEP_MARKER: &str = "matmul_q8_kernel";
/// A speculative step has a one-token head for each draft and ends with the verification's
/// head over all its rows (the small-batch tile products, as many CTAs as the one-token head):
/// where the rings hold at least [`VERIFY_RUNS_MIN`] runs of this one, they end the steps. A
/// plain decode's rings hold a few at most (a prompt's last logits).
const VERIFY_MARKER: &str = "matmul_q8_tiles_kernel";
const VERIFY_RUNS_MIN: usize = STEPS / 2;

/// One launch as its first CTA recorded it.
#[derive(Clone, Debug, PartialEq)]
struct Record {
    /// Nanoseconds of the global clock when the first CTA reached its wait.
    start: u64,
    /// ... and when the wait returned.
    release: u64,
    ctas: u32,
    threads: u32,
    name: String,
}

/// The records of one module's ring (`bytes`: the `redlite_timeline` array; `count`: its
/// counter), oldest first: the last `RECORDS` launches at most.
fn parse(bytes: &[u8], count: u32) -> Vec<Record> {
    let count = count as usize;
    let kept = count.min(RECORDS).min(bytes.len() / RECORD_BYTES);
    let first = count.saturating_sub(kept);
    (first..count)
        .filter_map(|n| {
            let at = (n % RECORDS) * RECORD_BYTES;
            let r = bytes.get(at..at + RECORD_BYTES)?;
            let u64_at = |i: usize| u64::from_le_bytes(r[i..i + 8].try_into().unwrap_or([0; 8]));
            let u32_at = |i: usize| u32::from_le_bytes(r[i..i + 4].try_into().unwrap_or([0; 4]));
            let name = &r[24..24 + NAME];
            let end = name.iter().position(|&b| b == 0).unwrap_or(NAME);
            Some(Record {
                start: u64_at(0),
                release: u64_at(8),
                ctas: u32_at(16),
                threads: u32_at(20),
                name: String::from_utf8_lossy(&name[..end]).into_owned(),
            })
        })
        .collect()
}

/// Steps the summary covers at most: the last ones of the run (with `bench -n 64 -r 1`, the
/// timed repetition's second half; the prompts' and the warm-up's launches stay out).
const STEPS: usize = 32;

/// Where each run of consecutive launches of `name` with `STEP_MARKER_MIN_CTAS` or more CTAs
/// ends in `sorted` (an LM head's pieces).
fn run_ends(sorted: &[&Record], name: &str) -> Vec<usize> {
    let marker = |r: &Record| r.name == name && r.ctas >= STEP_MARKER_MIN_CTAS;
    (0..sorted.len())
        .filter(|&i| marker(sorted[i]) && sorted.get(i + 1).is_none_or(|n| !marker(n)))
        .collect()
}

/// The per-kernel summary of the modules' records (each module's list oldest first).
fn report(modules: &[Vec<Record>]) -> String {
    // Where every module's launches are all there: from the latest of the full rings' oldest
    // kept records on.
    let complete_from = modules
        .iter()
        .filter(|m| m.len() >= RECORDS)
        .filter_map(|m| m.iter().map(|r| r.release).min())
        .max()
        .unwrap_or(0);
    let mut sorted: Vec<&Record> = modules
        .iter()
        .flatten()
        .filter(|r| r.release >= complete_from && r.release >= r.start)
        .collect();
    sorted.sort_by_key(|r| r.release);
    // Steps end with a run of the LM head's pieces: the window is the last STEPS whole steps,
    // from after one such run to the end of the last one.
    let verify_ends = run_ends(&sorted, VERIFY_MARKER);
    let (marker, run_ends) = if verify_ends.len() >= VERIFY_RUNS_MIN {
        (VERIFY_MARKER, verify_ends)
    } else {
        (STEP_MARKER, run_ends(&sorted, STEP_MARKER))
    };
    let (window, steps) = match run_ends.len() {
        0 | 1 => (0..sorted.len(), run_ends.len().max(1)),
        n => {
            let steps = (n - 1).min(STEPS);
            (run_ends[n - 1 - steps] + 1..run_ends[n - 1] + 1, steps)
        }
    };
    // (name, ctas, threads) to (launches, share ns, early ns).
    let mut kernels: HashMap<(String, u32, u32), (u64, u64, u64)> = HashMap::new();
    for i in window.clone() {
        let r = sorted[i];
        let next = sorted.get(i + 1).map_or(r.release, |n| n.release);
        let entry = kernels
            .entry((r.name.clone(), r.ctas, r.threads))
            .or_insert((0, 0, 0));
        entry.0 += 1;
        entry.1 += next - r.release;
        entry.2 += r.release - r.start;
    }
    let total: u64 = kernels.values().map(|k| k.1).sum();
    let mut rows: Vec<_> = kernels.into_iter().collect();
    rows.sort_by_key(|row| std::cmp::Reverse(row.1 .1));
    let per_step = |ns: u64| ns as f64 / 1e3 / steps as f64;
    let mut out = format!(
        "timeline: {} launches over {} steps ({:.1} µs a step of releases)\n\
         {:<26} {:>7} {:>5} {:>13} {:>14} {:>8} {:>8}\n",
        window.len(),
        steps,
        per_step(total),
        "kernel",
        "ctas",
        "thr",
        "launches/step",
        "share µs/step",
        "share %",
        "early µs",
    );
    if run_ends.len() < 2 {
        out.insert_str(
            0,
            &format!(
                "(no two runs of {marker} with {STEP_MARKER_MIN_CTAS}+ CTAs: no steps found, \
             the whole ring counted as one)\n"
            ),
        );
    }
    for ((name, ctas, threads), (launches, share, early)) in rows {
        out += &format!(
            "{:<26} {:>7} {:>5} {:>13.1} {:>14.1} {:>7.1}% {:>8.2}\n",
            name,
            ctas,
            threads,
            launches as f64 / steps as f64,
            per_step(share),
            100.0 * share as f64 / total.max(1) as f64,
            early as f64 / 1e3 / launches.max(1) as f64,
        );
    }
    out
}

/// Every module's records, read after the stream's work has ended; a module whose arrays
/// cannot be read is named in the report instead.
pub(crate) fn read(modules: &[(String, Arc<CudaModule>)], stream: &Arc<CudaStream>) -> String {
    if let Err(e) = stream.synchronize() {
        return format!("timeline: the stream did not finish: {e}\n");
    }
    let mut records = Vec::new();
    let mut unread = Vec::new();
    for (name, module) in modules {
        let read_module = || -> Result<Vec<Record>, cudarc::driver::DriverError> {
            let count = module.get_global("redlite_timeline_count", stream)?;
            let mut n = [0u8; 4];
            stream.memcpy_dtoh(&count, &mut n)?;
            let ring = module.get_global("redlite_timeline", stream)?;
            let mut bytes = vec![0u8; ring.len()];
            stream.memcpy_dtoh(&ring, &mut bytes)?;
            stream.synchronize()?;
            Ok(parse(&bytes, u32::from_le_bytes(n)))
        };
        match read_module() {
            Ok(r) => records.push(r),
            Err(e) => unread.push(format!("{name} ({e})")),
        }
    }
    let mut out = report(&records);
    if !unread.is_empty() {
        out += &format!("timeline: not read: {}\n", unread.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes_of(records: &[(u64, u64, u32, u32, &str)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(start, release, ctas, threads, name) in records {
            out.extend(start.to_le_bytes());
            out.extend(release.to_le_bytes());
            out.extend(ctas.to_le_bytes());
            out.extend(threads.to_le_bytes());
            let mut n = [0u8; NAME];
            n[..name.len()].copy_from_slice(name.as_bytes());
            out.extend(n);
        }
        out
    }

    #[test]
    fn records_parse_in_the_kernels_layout() {
        let bytes = bytes_of(&[
            (10, 15, 704, 128, "moe_gate_up_q8_kernel"),
            (12, 30, 1, 32, "x"),
        ]);
        let records = parse(&bytes, 2);
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].start, 10);
        assert_eq!(records[0].release, 15);
        assert_eq!(records[0].ctas, 704);
        assert_eq!(records[0].threads, 128);
        assert_eq!(records[0].name, "moe_gate_up_q8_kernel");
        assert_eq!(records[1].name, "x");
        // A ring that went round: RECORDS + 3 launches, the oldest kept first.
        let slots: Vec<_> = (0..RECORDS as u64).map(|i| (i, i, 1, 1, "k")).collect();
        let ring = parse(&bytes_of(&slots), RECORDS as u32 + 3);
        assert_eq!(ring.len(), RECORDS);
        assert_eq!((ring[0].start, ring[RECORDS - 1].start), (3, 2));
    }

    /// A launch of `ctas` CTAs of 128 threads.
    fn record(start: u64, release: u64, ctas: u32, name: &str) -> Record {
        Record {
            start,
            release,
            ctas,
            threads: 128,
            name: name.into(),
        }
    }

    #[test]
    fn each_kernel_gets_the_time_to_the_next_release() {
        // Three steps of a chain: a, the LM head in two pieces (one run ends a step), then b
        // (the next step's first kernel in the window). The window: after the first head's
        // run to the end of the last, two steps.
        let head = STEP_MARKER_MIN_CTAS;
        let step = |t: u64| {
            vec![
                record(t, t + 2_000, 1, "a"),
                record(t + 1_000, t + 10_000, head, STEP_MARKER),
                record(t + 10_500, t + 11_000, head, STEP_MARKER),
                record(t + 12_000, t + 13_000, 2, "b"),
            ]
        };
        let records: Vec<Record> = [0, 20_000, 40_000].into_iter().flat_map(step).collect();
        // Without the marker (a kernel's name recorded wrong) the report says so first.
        let unnamed: Vec<Record> = records
            .iter()
            .map(|r| Record {
                name: "a".into(),
                ..r.clone()
            })
            .collect();
        assert!(report(&[unnamed]).starts_with("(no two runs"));
        let text = report(&[records]);
        assert!(text.contains("8 launches over 2 steps"), "{text}");
        let line = |name: &str| {
            let row = text.lines().find(|l| l.starts_with(name));
            let cells = row.unwrap_or_default().split_whitespace();
            cells.map(String::from).collect::<Vec<_>>()
        };
        // Columns: name, ctas, threads, launches/step, share µs/step, share %, early µs.
        // a: 8 µs to the head's first release.
        assert_eq!(line("a ")[4], "8.0", "{text}");
        // The head's two pieces: 1 + 2 µs a step; their first CTAs waited 9 and 0.5 µs.
        let head = line(STEP_MARKER);
        let cells = (head[3].as_str(), head[4].as_str(), head[6].as_str());
        assert_eq!(cells, ("2.0", "3.0", "4.75"), "{text}");
        // b: 9 µs to the next step's a.
        assert_eq!(line("b ")[4], "9.0", "{text}");
    }

    #[test]
    fn speculative_steps_end_with_the_verification_head() {
        let record = |release: u64, ctas: u32, name: &str| record(release, release, ctas, name);
        // Each step: three drafts (a layer, then a one-token head), the verification, its head.
        let head = STEP_MARKER_MIN_CTAS;
        let step = |t: u64| {
            let mut launches = Vec::new();
            for d in 0..3 {
                launches.push(record(t + 10 * d, 1, "mtp_layer"));
                launches.push(record(t + 10 * d + 5, head, STEP_MARKER));
            }
            launches.push(record(t + 40, 4, "verify"));
            launches.push(record(t + 50, head, VERIFY_MARKER));
            launches
        };
        let records: Vec<Record> = (0..VERIFY_RUNS_MIN as u64 + 1)
            .flat_map(|s| step(100 * s))
            .collect();
        let text = report(std::slice::from_ref(&records));
        let steps = VERIFY_RUNS_MIN;
        assert!(text.contains(&format!("over {steps} steps")), "{text}");
        // Fewer verification runs than that (five steps): the one-token heads count, three a
        // step, the window from after the first.
        let text = report(&[records[..8 * 5].to_vec()]);
        assert!(text.contains("over 14 steps"), "{text}");
    }
}
