//! The CPU backend's thread pool: one parallel region per call of [`for_each`], the calling
//! thread working alongside the helpers.
//!
//! Why not rayon here: a decode step runs ~65 regions of a few hundred microseconds each,
//! with short serial stretches between them. Entered from a thread outside its pool,
//! rayon parks the caller on every region and its idle workers go to sleep within
//! microseconds, so each region paid a futex wake-up of a helper and of the caller (~280
//! context switches per token; the machine was 25 % idle during decode). Here the caller
//! takes tasks itself and the helpers spin for [`SPIN`] after a region before they sleep,
//! so back-to-back regions cost an atomic store and a few cache-line transfers.
//!
//! The pool has `rayon::current_num_threads()` threads in all (the CLI's `--threads`),
//! created on first use and kept for the life of the process. A call made from inside a
//! task, or while another thread's region is running, runs its tasks inline.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use crate::error::{EngineError, Result};

/// How long an idle helper spins before it sleeps: longer than the serial work between
/// two regions of a forward step, short enough that an idle engine stops burning a core.
const SPIN: Duration = Duration::from_millis(5);

/// One region's work: task `i` for every `i < tasks`.
type Task<'a> = dyn Fn(usize) -> Result<()> + Sync + 'a;

struct Region {
    task: &'static Task<'static>,
    tasks: usize,
}

struct Shared {
    /// Bumped when a region opens; helpers watch it.
    generation: AtomicU64,
    /// Whether the current region still accepts helpers.
    open: AtomicBool,
    /// Helpers inside the current region (joined and not yet left).
    active: AtomicUsize,
    /// The next unclaimed task index.
    next: AtomicUsize,
    /// The current region (on the caller's stack; set before `open`, cleared after `active`
    /// drains). An atomic, not a lock: every helper reads it at the same moment when a
    /// region opens, and with many helpers a lock there queued them in the kernel while the
    /// caller waited for each to leave.
    region: AtomicPtr<Region>,
    /// The first error of the region, and whether a task panicked (its payload).
    failure: Mutex<Option<Failure>>,
    /// Helpers asleep, and their wake-up.
    sleepers: Mutex<usize>,
    wake: Condvar,
    /// Held by the thread whose region is running.
    caller: Mutex<()>,
}

enum Failure {
    Error(EngineError),
    Panic(Box<dyn std::any::Any + Send>),
}

thread_local! {
    /// Set while this thread runs a region's tasks: a nested call runs inline.
    static IN_REGION: Cell<bool> = const { Cell::new(false) };
}

static SHARED: Shared = Shared {
    generation: AtomicU64::new(0),
    open: AtomicBool::new(false),
    active: AtomicUsize::new(0),
    next: AtomicUsize::new(0),
    region: AtomicPtr::new(std::ptr::null_mut()),
    failure: Mutex::new(None),
    sleepers: Mutex::new(0),
    wake: Condvar::new(),
    caller: Mutex::new(()),
};

/// The number of helper threads, started on first use.
fn helpers() -> usize {
    static HELPERS: OnceLock<usize> = OnceLock::new();
    *HELPERS.get_or_init(|| {
        let wanted = rayon::current_num_threads().max(1) - 1;
        (0..wanted)
            .filter(|i| {
                std::thread::Builder::new()
                    .name(format!("redlite-cpu-{}", i + 1))
                    .spawn(|| helper(&SHARED))
                    .is_ok()
            })
            .count()
    })
}

/// Runs `task(i)` for every `i < tasks` across the pool (this thread included) and returns
/// when all are done; the first error any task returned, if one did. A task that panics
/// makes this call panic with its payload once every thread has left the region.
pub fn for_each(tasks: usize, task: &Task<'_>) -> Result<()> {
    if tasks <= 1 || helpers() == 0 || IN_REGION.with(Cell::get) {
        return (0..tasks).try_for_each(task);
    }
    let shared = &SHARED;
    let _caller = match shared.caller.try_lock() {
        Ok(guard) => guard,
        Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        // Another thread's region is running (tests, several engines): no waiting on it.
        Err(TryLockError::WouldBlock) => return (0..tasks).try_for_each(task),
    };
    // SAFETY: the helpers reach `task` only through `shared.region` while they are counted
    // in `active`, and only after seeing `open`. `Close` (below, also run on unwind) clears
    // `open`, waits for `active` to drain and then removes the region, all before this
    // function returns; so no helper uses `task` after the borrow it came from ends.
    let task_static: &'static Task<'static> = unsafe { std::mem::transmute(task) };
    let region = Region {
        task: task_static,
        tasks,
    };
    // The same argument covers `region` itself: it outlives every helper's use (below).
    shared
        .region
        .store(&region as *const Region as *mut Region, SeqCst);
    shared.next.store(0, SeqCst);
    shared.open.store(true, SeqCst);
    shared.generation.fetch_add(1, SeqCst);
    if *lock(&shared.sleepers) > 0 {
        shared.wake.notify_all();
    }
    let close = Close(shared);
    work(shared, task, tasks);
    drop(close);
    match lock(&shared.failure).take() {
        None => Ok(()),
        Some(Failure::Error(e)) => Err(e),
        Some(Failure::Panic(payload)) => resume_unwind(payload),
    }
}

/// A slice that pool tasks write in disjoint ranges (each task its own), borrowed mutably
/// for the life of this value.
pub struct Disjoint<'a, T> {
    ptr: *mut T,
    len: usize,
    _borrow: std::marker::PhantomData<&'a mut [T]>,
}

// SAFETY: tasks reach the elements only through `range_mut`, whose callers promise that no
// two ranges in use overlap; `T: Send` lets the elements be written from another thread.
unsafe impl<T: Send> Sync for Disjoint<'_, T> {}

impl<'a, T> Disjoint<'a, T> {
    pub fn new(data: &'a mut [T]) -> Disjoint<'a, T> {
        Disjoint {
            ptr: data.as_mut_ptr(),
            len: data.len(),
            _borrow: std::marker::PhantomData,
        }
    }

    /// Elements `start..end`, clamped to the slice.
    ///
    /// # Safety
    /// No other range in use while the result lives may overlap this one.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn range_mut(&self, start: usize, end: usize) -> &mut [T] {
        let start = start.min(self.len);
        let end = end.clamp(start, self.len);
        std::slice::from_raw_parts_mut(self.ptr.add(start), end - start)
    }
}

/// Runs `task(i, piece_i)` over the consecutive pieces of `piece` elements of `data` (the
/// last may be shorter), across the pool, without allocating (where a `Vec` of locked
/// sub-slices would).
pub fn for_each_piece<T: Send>(
    data: &mut [T],
    piece: usize,
    task: &(dyn Fn(usize, &mut [T]) -> Result<()> + Sync),
) -> Result<()> {
    let piece = piece.max(1);
    let count = data.len().div_ceil(piece);
    let data = Disjoint::new(data);
    // SAFETY: `for_each` runs each index exactly once, and the pieces do not overlap.
    for_each(count, &|i| {
        task(i, unsafe { data.range_mut(i * piece, (i + 1) * piece) })
    })
}

/// A task of [`for_each_piece_pair`]: its index and its pieces of the two slices.
type PairTask<'a, A, B> = dyn Fn(usize, &mut [A], &mut [B]) -> Result<()> + Sync + 'a;

/// [`for_each_piece`] over two slices cut into the same number of pieces: `task(i, a_i, b_i)`.
pub fn for_each_piece_pair<A: Send, B: Send>(
    a: &mut [A],
    a_piece: usize,
    b: &mut [B],
    b_piece: usize,
    task: &PairTask<'_, A, B>,
) -> Result<()> {
    let (a_piece, b_piece) = (a_piece.max(1), b_piece.max(1));
    let count = a.len().div_ceil(a_piece).min(b.len().div_ceil(b_piece));
    let (a, b) = (Disjoint::new(a), Disjoint::new(b));
    // SAFETY: `for_each` runs each index exactly once, and the pieces do not overlap.
    for_each(count, &|i| {
        let a_i = unsafe { a.range_mut(i * a_piece, (i + 1) * a_piece) };
        let b_i = unsafe { b.range_mut(i * b_piece, (i + 1) * b_piece) };
        task(i, a_i, b_i)
    })
}

/// Ends the region: no new helpers, wait for those inside, remove the task.
struct Close(&'static Shared);

impl Drop for Close {
    fn drop(&mut self) {
        let shared = self.0;
        shared.open.store(false, SeqCst);
        let mut spins = 0u32;
        while shared.active.load(SeqCst) > 0 {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        shared.region.store(std::ptr::null_mut(), SeqCst);
    }
}

/// Claims and runs tasks until none are left, recording the first failure.
fn work(shared: &Shared, task: &Task<'_>, tasks: usize) {
    IN_REGION.with(|c| c.set(true));
    loop {
        let i = shared.next.fetch_add(1, SeqCst);
        if i >= tasks {
            break;
        }
        let failure = match catch_unwind(AssertUnwindSafe(|| task(i))) {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => Failure::Error(e),
            Err(payload) => Failure::Panic(payload),
        };
        // Stop handing out tasks; keep the first failure.
        shared.next.store(tasks, SeqCst);
        let mut slot = lock(&shared.failure);
        if slot.is_none() {
            *slot = Some(failure);
        }
        break;
    }
    IN_REGION.with(|c| c.set(false));
}

fn helper(shared: &'static Shared) {
    let mut seen = 0u64;
    let mut idle_since = Instant::now();
    loop {
        let generation = shared.generation.load(SeqCst);
        if generation == seen {
            if idle_since.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            let mut sleepers = lock(&shared.sleepers);
            *sleepers += 1;
            // Checked under the lock the caller takes to notify: no wake-up is lost.
            while shared.generation.load(SeqCst) == seen {
                sleepers = shared
                    .wake
                    .wait(sleepers)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            *sleepers -= 1;
            continue;
        }
        seen = generation;
        shared.active.fetch_add(1, SeqCst);
        if shared.open.load(SeqCst) {
            let region = shared.region.load(SeqCst);
            // SAFETY: counted in `active` and having seen `open`, this helper holds the
            // caller in `Close` until it leaves, so the region it points to is alive.
            if let Some(region) = unsafe { region.as_ref() } {
                work(shared, region.task, region.tasks);
            }
        }
        shared.active.fetch_sub(1, SeqCst);
        idle_since = Instant::now();
    }
}

/// A lock that ignores poisoning (the pool's state stays consistent across a panic).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_task_runs_once() {
        for tasks in [0, 1, 2, 7, 64, 1000] {
            let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
            for_each(tasks, &|i| {
                hits[i].fetch_add(1, SeqCst);
                Ok(())
            })
            .expect("no task fails");
            assert!(hits.iter().all(|h| h.load(SeqCst) == 1), "tasks = {tasks}");
        }
    }

    #[test]
    fn the_first_error_comes_back_and_the_pool_goes_on() {
        let result = for_each(50, &|i| {
            if i == 17 {
                Err(EngineError::BadConfig("task 17".into()))
            } else {
                Ok(())
            }
        });
        assert!(matches!(result, Err(EngineError::BadConfig(m)) if m == "task 17"));
        let count = AtomicUsize::new(0);
        for_each(40, &|_| {
            count.fetch_add(1, SeqCst);
            Ok(())
        })
        .expect("no task fails");
        assert_eq!(count.load(SeqCst), 40);
    }

    #[test]
    fn pieces_cover_the_slice_once() {
        for (len, piece) in [(0, 4), (1, 4), (10, 3), (64, 16), (65, 16)] {
            let mut data = vec![0u32; len];
            for_each_piece(&mut data, piece, &|i, p| {
                p.iter_mut().for_each(|v| *v += i as u32 + 1);
                Ok(())
            })
            .expect("no task fails");
            let want: Vec<u32> = (0..len).map(|j| (j / piece) as u32 + 1).collect();
            assert_eq!(data, want, "len {len}, piece {piece}");
        }
        let (mut a, mut b) = (vec![0u8; 12], vec![0u16; 6]);
        for_each_piece_pair(&mut a, 4, &mut b, 2, &|i, x, y| {
            x.fill(i as u8);
            y.fill(i as u16);
            Ok(())
        })
        .expect("no task fails");
        assert_eq!(a, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(b, [0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn nested_calls_run_inline() {
        let count = AtomicUsize::new(0);
        for_each(8, &|_| {
            for_each(4, &|_| {
                count.fetch_add(1, SeqCst);
                Ok(())
            })
        })
        .expect("no task fails");
        assert_eq!(count.load(SeqCst), 32);
    }
}
