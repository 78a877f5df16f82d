//! [`HostRows`]: the host buffer the device's logit rows land in every step.
//!
//! On a real GPU it is page-locked (`cuMemHostAlloc`). A copy into pageable memory goes
//! through the driver's own bounce buffers, at a fraction of the link's speed, and
//! sampled requests bring whole rows back every step: 16 MB a step at batch 32 over a
//! 128k vocabulary. On the emulator it is plain heap memory.

use std::ptr::NonNull;

/// Frees the memory of a [`HostRows`] it was made with.
pub type Release = Box<dyn FnOnce(NonNull<f32>, usize) + Send>;

/// A fixed-length `f32` buffer in host memory; derefs to a slice.
pub struct HostRows {
    ptr: NonNull<f32>,
    len: usize,
    release: Option<Release>,
}

// SAFETY: a `HostRows` owns its memory alone (nothing else holds the pointer), like a
// `Box<[f32]>`; `Release` is `Send`.
unsafe impl Send for HostRows {}

impl HostRows {
    /// `len` zeroes on the heap.
    pub fn heap(len: usize) -> Self {
        let boxed: Box<[f32]> = vec![0.0; len].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(boxed) as *mut f32).expect("Box is never null");
        let release: Release = Box::new(|ptr, len| {
            // SAFETY: `ptr` and `len` are those of the boxed slice leaked just above.
            drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(ptr.as_ptr(), len)) })
        });
        HostRows {
            ptr,
            len,
            release: Some(release),
        }
    }

    /// Takes ownership of `len` floats at `ptr`, handed to `release` on drop.
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` initialised `f32`s, aligned,
    /// used by nothing else until `release` runs, and `release` must free it.
    pub unsafe fn from_raw(ptr: NonNull<f32>, len: usize, release: Release) -> Self {
        HostRows {
            ptr,
            len,
            release: Some(release),
        }
    }
}

impl std::ops::Deref for HostRows {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        // SAFETY: valid for `len` floats and owned by `self` (the constructors' contract).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::DerefMut for HostRows {
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for HostRows {
    fn drop(&mut self) {
        if let Some(release) = self.release.take() {
            release(self.ptr, self.len);
        }
    }
}

impl std::fmt::Debug for HostRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRows").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn heap_rows_are_zeroed_writable_and_freed() {
        let mut rows = HostRows::heap(1000);
        assert_eq!(rows.len(), 1000);
        assert!(rows.iter().all(|&v| v == 0.0));
        rows[999] = 2.5;
        assert_eq!(rows[999], 2.5);
        let empty = HostRows::heap(0);
        assert!(empty.is_empty());
    }

    #[test]
    fn release_runs_once_on_drop_with_the_pointer_it_was_given() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut backing = vec![1.0f32; 8].into_boxed_slice();
        let ptr = NonNull::new(backing.as_mut_ptr()).unwrap();
        let (seen, addr) = (calls.clone(), ptr.as_ptr() as usize);
        let release: Release = Box::new(move |p, len| {
            assert_eq!((p.as_ptr() as usize, len), (addr, 8));
            seen.fetch_add(1, Ordering::SeqCst);
        });
        // SAFETY: `backing` outlives `rows` and nothing else touches it meanwhile.
        let rows = unsafe { HostRows::from_raw(ptr, 8, release) };
        assert_eq!(rows.iter().sum::<f32>(), 8.0);
        drop(rows);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop(backing);
    }
}
