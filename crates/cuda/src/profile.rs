//! Two profiles. `REDLITE_CUDA_PROFILE=1`: every layer-kernel launch waits for the stream
//! before and after it, and the wall time in between is added up per kernel (matmuls per
//! shape); the table goes to stderr when the device is dropped. For finding where decode time
//! goes on a machine without a profiler; it serializes everything, so CUDA graphs are off
//! with it. `--profile` (below): the stream's time per model component, from CUDA events.

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use crate::error::CudaError;

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

/// `--profile`: the stream's time split by model component. The engine marks where each
/// component's launches begin (`Device::mark`, an event recorded on the stream: nothing
/// waits); the time from one mark to the next is the earlier one's. Launches are not
/// serialized, so the split is of a normal run's stream time (gaps where the GPU waits for the
/// host included); the decode graph is off while it is on (an event recorded during a
/// capture would time the capture, not the replays).
static COMPONENTS: AtomicBool = AtomicBool::new(false);

/// The marks since the last [`take_components`]: (component, event), and the stream they
/// were recorded on (one device per process).
struct Marks {
    marks: Vec<(&'static str, CudaEvent)>,
    stream: Option<Arc<CudaStream>>,
}

static MARKS: Mutex<Marks> = Mutex::new(Marks {
    marks: Vec::new(),
    stream: None,
});

/// Turns the component split on (for the rest of the process).
pub fn enable_components() {
    COMPONENTS.store(true, Ordering::Relaxed);
}

/// Whether the component split is on.
pub fn components_on() -> bool {
    COMPONENTS.load(Ordering::Relaxed)
}

/// Records the start of `component`'s launches on `stream`.
pub(crate) fn mark(stream: &Arc<CudaStream>, component: &'static str) {
    if !components_on() {
        return;
    }
    let timed = Some(CUevent_flags::CU_EVENT_DEFAULT);
    if let (Ok(event), Ok(mut marks)) = (stream.record_event(timed), MARKS.lock()) {
        marks.marks.push((component, event));
        marks.stream.get_or_insert_with(|| stream.clone());
    }
}

/// One component's share of the stream time.
#[derive(Clone, Debug, PartialEq)]
pub struct ComponentTime {
    pub component: &'static str,
    pub milliseconds: f64,
    /// Times the component started (per layer and call).
    pub spans: u64,
}

/// Time per component between the marks recorded since the last call, largest first (waits
/// for the stream); empty when nothing was marked.
pub fn take_components() -> Result<Vec<ComponentTime>, CudaError> {
    let stream = MARKS.lock().ok().and_then(|m| m.stream.clone());
    let Some(stream) = stream else {
        return Ok(Vec::new());
    };
    // Closes the last component's span.
    mark(&stream, "end");
    let marks = match MARKS.lock() {
        Ok(mut marks) => std::mem::take(&mut marks.marks),
        Err(_) => return Ok(Vec::new()),
    };
    let mut table: Vec<ComponentTime> = Vec::new();
    for pair in marks.windows(2) {
        let ((component, start), (_, end)) = (&pair[0], &pair[1]);
        let ms = start
            .elapsed_ms(end)
            .map_err(CudaError::driver("cuEventElapsedTime"))?;
        match table.iter_mut().find(|c| c.component == *component) {
            Some(c) => {
                c.milliseconds += f64::from(ms);
                c.spans += 1;
            }
            None => table.push(ComponentTime {
                component,
                milliseconds: f64::from(ms),
                spans: 1,
            }),
        }
    }
    table.sort_by(|a, b| b.milliseconds.total_cmp(&a.milliseconds));
    Ok(table)
}
