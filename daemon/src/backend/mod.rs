//! Compute backends behind one interface, so the engine never knows which one runs.
//!
//! A [`Backend`] owns everything a forward step touches besides the immutable model
//! file: the KV cache (its block pool and storage) and the step's buffers, including
//! the logits the engine samples from. The CPU backend ([`cpu::CpuBackend`]) wraps the
//! CPU forward pass as it was; the CUDA backend ([`cuda::CudaBackend`]) runs the same
//! step on a GPU, or on the kernel emulator in tests.

use std::sync::Arc;
use std::time::Duration;

use crate::model::{BlockPool, BlockTable, ForwardError, KvFull, SeqInput};

pub mod cpu;
pub mod cuda;
pub mod parity;

pub use cpu::CpuBackend;
pub use cuda::CudaBackend;

/// Why a forward step failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The batch itself is wrong (a host bug or a bad token): the same on every backend.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// The device failed (a launch, a copy, memory).
    #[error("CUDA: {0}")]
    Gpu(#[from] cuda::GpuError),
}

/// What `Status` reports about the backend. Shared with the handle, which answers
/// status requests on other threads than the engine's.
pub trait DeviceReport: Send + Sync {
    /// `cpu` or `cuda`.
    fn backend(&self) -> &'static str;
    /// The device in words, e.g. `NVIDIA GB10 (sm_121) · 100.2 of 119.6 GiB free`;
    /// memory figures are read when asked, not at start.
    fn device(&self) -> String;
}

/// Threads on the host that a backend lends the engine between its steps.
pub trait HostThreads {
    /// Calls `f(i)` once for every `i` in `0..tasks`, in parallel where there are
    /// threads for it, and returns when all have returned.
    fn for_each_task(&self, tasks: usize, f: &(dyn Fn(usize) + Sync));
}

impl HostThreads for cpu::ThreadPool {
    fn for_each_task(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        cpu::ThreadPool::for_each_task(self, tasks, f);
    }
}

/// One compute backend: the forward pass, its KV cache and its logits.
pub trait Backend: Send {
    /// Runs one step over `batch`, writing its K/V into this backend's cache and the
    /// requested logits where [`Backend::logits_mut`] finds them. Returns the step's
    /// duration (measured on the device for GPUs).
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Duration, BackendError>;

    /// Logits of the `i`-th batch item of the last step that asked for them (in batch
    /// order), mutable because samplers apply penalties in place.
    fn logits_mut(&mut self, i: usize) -> &mut [f32];

    /// The first `rows` logit rows of the last step, back to back (`rows * vocab`
    /// floats; fewer if the step made fewer), with the host threads to sample them on:
    /// the CPU forward's pool (`--threads`), or a pool of the host's cores behind a GPU.
    fn logit_rows_mut(&mut self, rows: usize) -> (&mut [f32], &dyn HostThreads);

    /// The argmax of the `i`-th logit row of the last step plus the row's bias (the
    /// sampler's greedy rule: the highest logit, the lowest id among equals, NaN never),
    /// where the backend computed it itself for a [`SeqInput::greedy`] row; such a row
    /// may be missing from
    /// [`Backend::logits_mut`]. `None` for other rows, and from backends that always
    /// hand over whole rows.
    fn greedy_pick(&mut self, i: usize) -> Option<u32> {
        let _ = i;
        None
    }

    /// The allocator of this backend's KV blocks (and its prefix cache).
    fn blocks(&self) -> &BlockPool;
    fn blocks_mut(&mut self) -> &mut BlockPool;

    /// Grows `table` to hold `positions` positions; all or nothing.
    fn reserve(&mut self, table: &mut BlockTable, positions: usize) -> Result<(), KvFull> {
        self.blocks_mut().reserve(table, positions)
    }
    /// Returns every block of `table` to the pool.
    fn release(&mut self, table: &mut BlockTable) {
        self.blocks_mut().release(table);
    }
    fn kv_used_blocks(&self) -> usize {
        self.blocks().used_blocks()
    }
    fn kv_total_blocks(&self) -> usize {
        self.blocks().total_blocks()
    }

    /// For `Status`.
    fn report(&self) -> Arc<dyn DeviceReport>;
    /// Threads of the CPU work (the forward's pool on the CPU; the host thread on GPUs).
    fn threads(&self) -> usize;
}
