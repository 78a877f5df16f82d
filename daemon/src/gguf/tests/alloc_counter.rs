//! A test-only global allocator that counts live heap bytes per thread, so a test can
//! measure the peak memory a parse takes while other tests run on other threads.
//!
//! It forwards every call to the system allocator unchanged; the only addition is a
//! thread-local counter update. It is compiled into the `sparkd` library's unit-test
//! binary only (`#[cfg(test)]`), never into the library or the daemon.

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
}

fn record(delta: i64) {
    // `try_with` fails only while the thread is being torn down; counts then no longer
    // matter.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// the `GlobalAlloc` contract holds exactly as it does for `System`. The bookkeeping
// touches only thread-local `Cell`s and never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            record(layout.size() as i64);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            record(layout.size() as i64);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        record(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            record(new_size as i64 - layout.size() as i64);
        }
        p
    }
}

/// Runs `f` and returns its result with the most heap bytes that were live at once on
/// this thread during the call, above what was live when it started.
pub(super) fn peak_heap_during<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let start = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(start));
    let out = f();
    let peak = PEAK.with(Cell::get);
    (out, (peak - start).max(0) as u64)
}

#[test]
fn counts_an_allocation_on_this_thread() {
    let (v, peak) = peak_heap_during(|| vec![0u8; 1 << 20]);
    assert!(peak >= 1 << 20, "peak {peak}");
    drop(v);
    let ((), peak) = peak_heap_during(|| ());
    assert_eq!(peak, 0);
}
