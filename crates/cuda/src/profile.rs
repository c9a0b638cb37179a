//! `REDLITE_CUDA_PROFILE=1`: every layer-kernel launch waits for the stream before and
//! after it, and the wall time in between is added up per kernel (matmuls per shape); the
//! table goes to stderr when the device is dropped. For finding where decode time goes on
//! a machine without a profiler; it serializes everything, so CUDA graphs are off with it.

use cudarc::driver::CudaStream;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Whether `REDLITE_CUDA_PROFILE=1` is set.
pub fn profiling() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_CUDA_PROFILE").as_deref() == Ok("1"))
}

/// Kernel label to (launches, seconds).
static TABLE: Mutex<BTreeMap<String, (u64, f64)>> = Mutex::new(BTreeMap::new());

thread_local! {
    static START: Cell<Option<Instant>> = const { Cell::new(None) };
    static LABEL: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Before a launch: waits for the stream, starts the clock.
pub(crate) fn before(stream: &CudaStream) {
    if profiling() {
        let _ = stream.synchronize();
        START.with(|s| s.set(Some(Instant::now())));
    }
}

/// A more precise label than the launch's name for the next `after` (matmul shapes).
pub(crate) fn label(text: impl FnOnce() -> String) {
    if profiling() {
        LABEL.with(|l| *l.borrow_mut() = Some(text()));
    }
}

/// After a launch: waits for the kernel, adds its time under `call` (or the label).
pub(crate) fn after(stream: &CudaStream, call: &str) {
    if !profiling() {
        return;
    }
    let _ = stream.synchronize();
    let Some(start) = START.with(|s| s.take()) else {
        return;
    };
    let seconds = start.elapsed().as_secs_f64();
    let name = LABEL
        .with(|l| l.borrow_mut().take())
        .unwrap_or_else(|| call.to_string());
    if let Ok(mut table) = TABLE.lock() {
        let entry = table.entry(name).or_insert((0, 0.0));
        entry.0 += 1;
        entry.1 += seconds;
    }
}

/// The table, slowest total first.
pub(crate) fn report() -> String {
    let Ok(table) = TABLE.lock() else {
        return String::new();
    };
    let mut rows: Vec<_> = table.iter().collect();
    rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
    let total: f64 = rows.iter().map(|r| r.1 .1).sum();
    let mut out = format!("cuda profile: {total:.3} s in kernels (synchronized launches)\n");
    for (name, (count, seconds)) in rows {
        out += &format!(
            "{:>9.3} ms {:>5.1} % {count:>8} x {:>8.2} us  {name}\n",
            seconds * 1e3,
            100.0 * seconds / total.max(1e-12),
            seconds * 1e6 / *count as f64
        );
    }
    out
}
