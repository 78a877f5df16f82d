//! A test-only global allocator that counts live heap bytes per thread, so a test can
//! measure the peak memory a decode takes while other tests run on other threads (the
//! same design as the one in the daemon's GGUF tests).
//!
//! It forwards every call to the system allocator unchanged; the only addition is a
//! thread-local counter update. It is compiled into this one test binary only.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

#[global_allocator]
static GLOBAL: Counting = Counting;

thread_local! {
    // Const-initialised and without Drop, so reading them from inside the allocator
    // never allocates or registers a destructor.
    static LIVE: Cell<i64> = const { Cell::new(0) };
    static PEAK: Cell<i64> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn record(delta: i64, size: usize) {
    // `try_with` fails only while the thread is being torn down; counts then no longer
    // matter.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
    let _ = LARGEST.try_with(|l| l.set(l.get().max(size)));
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// the `GlobalAlloc` contract holds exactly as it does for `System`. The bookkeeping
// touches only thread-local `Cell`s and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            record(layout.size() as i64, layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            record(layout.size() as i64, layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        record(-(layout.size() as i64), 0);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            record(new_size as i64 - layout.size() as i64, new_size);
        }
        p
    }
}

/// What `f` took from the heap on this thread.
#[derive(Debug, Clone, Copy)]
pub struct HeapUse {
    /// Most bytes live at once, above what was live when `f` started.
    pub peak: u64,
    /// The largest single allocation (or reallocation) requested.
    pub largest: u64,
}

pub fn heap_during<T>(f: impl FnOnce() -> T) -> (T, HeapUse) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    LARGEST.with(|l| l.set(0));
    let out = f();
    let peak = PEAK.with(Cell::get);
    let largest = LARGEST.with(Cell::get);
    (
        out,
        HeapUse {
            peak: (peak - start).max(0) as u64,
            largest: largest as u64,
        },
    )
}
