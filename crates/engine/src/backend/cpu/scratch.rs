//! Scratch vectors that outlive the call that used them: each thread keeps the buffers its
//! calls gave back and hands them out again, so a decode step, once warm, allocates nothing
//! (a fresh `vec!` per op also paid page faults and a memset for every large buffer).

use std::cell::RefCell;
use std::ops::{Deref, DerefMut};

/// Buffers a thread keeps; more than any op holds at once.
const KEPT: usize = 16;

/// Bytes a thread keeps at most: every buffer of a decode step (the largest, attention
/// scores at a 256K context, is 8 MiB), not a prompt's (tens of MiB each), which go back to
/// the allocator so that generation runs within the memory issue 11 allows.
const KEPT_BYTES: usize = 16 << 20;

thread_local! {
    static FREE: RefCell<Vec<Vec<f32>>> = const { RefCell::new(Vec::new()) };
}

/// A scratch vector of f32, back in its thread's pool when dropped.
pub struct Scratch {
    buf: Vec<f32>,
}

impl Scratch {
    /// `len` zeros.
    pub fn zeroed(len: usize) -> Scratch {
        Scratch::with_capacity(len, len)
    }

    /// `len` zeros in a buffer of at least `capacity` values, for a length that grows from
    /// call to call (attention scores): one allocation for the whole run, not one per size.
    pub fn with_capacity(len: usize, capacity: usize) -> Scratch {
        let mut buf = take(capacity.max(len));
        buf.resize(len, 0.0);
        Scratch { buf }
    }
}

/// Returns the allocator's free memory to the system. glibc keeps freed heap memory (a
/// prompt's buffers, ~200 MiB for a 512-token chunk of the 80B shapes) resident in its
/// arenas; `malloc_trim` releases it, free pages inside the heap included, so generation
/// after a prompt runs in the file's pages plus what decoding holds.
pub fn return_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only gives back memory the allocator holds free; no live
    // allocation is touched.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The kept buffer that fits `capacity` most tightly, or else the largest one, grown.
fn take(capacity: usize) -> Vec<f32> {
    let picked = FREE.with_borrow_mut(|free| {
        let fits = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= capacity)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        let largest = || {
            free.iter()
                .enumerate()
                .max_by_key(|(_, b)| b.capacity())
                .map(|(i, _)| i)
        };
        fits.or_else(largest).map(|i| free.swap_remove(i))
    });
    let mut buf = picked.unwrap_or_default();
    buf.clear();
    buf.reserve(capacity);
    buf
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let buf = std::mem::take(&mut self.buf);
        // During thread teardown the pool may be gone: the buffer is then just freed.
        let _ = FREE.try_with(|free| {
            if let Ok(mut free) = free.try_borrow_mut() {
                let kept: usize = free.iter().map(|b| b.capacity()).sum();
                let bytes = (kept + buf.capacity()) * std::mem::size_of::<f32>();
                if free.len() < KEPT && bytes <= KEPT_BYTES {
                    free.push(buf);
                }
            }
        });
    }
}

impl Deref for Scratch {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf
    }
}

impl DerefMut for Scratch {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.buf
    }
}

impl<'a> IntoIterator for &'a Scratch {
    type Item = &'a f32;
    type IntoIter = std::slice::Iter<'a, f32>;
    fn into_iter(self) -> Self::IntoIter {
        self.buf.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_zeroed_and_are_reused() {
        let first_ptr = {
            let mut a = Scratch::zeroed(100);
            a.iter_mut().for_each(|v| *v = 7.0);
            a.as_ptr()
        };
        let b = Scratch::zeroed(50);
        assert_eq!(b.len(), 50);
        assert!(b.iter().all(|&v| v == 0.0));
        assert_eq!(b.as_ptr(), first_ptr, "the kept buffer is handed out again");
        let c = Scratch::with_capacity(10, 1000);
        assert_eq!(c.len(), 10);
        assert!(c.buf.capacity() >= 1000);
    }

    #[test]
    fn a_prompt_sized_buffer_goes_back_to_the_allocator() {
        let big = KEPT_BYTES / std::mem::size_of::<f32>() + 1;
        drop(Scratch::zeroed(big));
        let kept = FREE.with_borrow(|free| free.iter().any(|b| b.capacity() >= big));
        assert!(!kept, "a buffer over {KEPT_BYTES} bytes stayed in the pool");
    }
}
