//! The device abstraction the CUDA forward is written against: buffers, copies, kernel
//! launches by name, step timing. Two implementations: [`super::real::CudaGpu`] over the
//! CUDA driver (cudarc), and [`super::emu::EmuGpu`] over the kernel emulator, which runs
//! the real `.cu` sources on the CPU so the host logic is tested without a GPU.
//!
//! Pointers are (buffer, byte offset) pairs rather than raw addresses: the emulator
//! needs to know which allocation an argument points into (two arguments into one
//! buffer must alias there as they do on the device), and offsets are how the forward
//! addresses a layer of the KV cache or a row of activations.

use std::collections::HashMap;
use std::time::Duration;

use super::host_rows::HostRows;

/// An allocation on the device. Plain ids: the forward owns its buffers for its whole
/// life and frees them all with the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Buf {
    pub id: u32,
    pub bytes: usize,
}

impl Buf {
    /// A pointer `offset` bytes into the buffer.
    pub fn at(self, offset: usize) -> DevPtr {
        DevPtr { buf: self, offset }
    }

    pub fn ptr(self) -> DevPtr {
        self.at(0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevPtr {
    pub buf: Buf,
    pub offset: usize,
}

impl DevPtr {
    /// The pointer `bytes` further on.
    pub fn offset_by(self, bytes: usize) -> DevPtr {
        DevPtr {
            buf: self.buf,
            offset: self.offset + bytes,
        }
    }
}

/// A recorded sequence of launches that replays with the same arguments (a CUDA
/// graph on the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphId(pub u32);

/// One kernel parameter, in the kernel's parameter order.
#[derive(Debug, Clone, Copy)]
pub enum KArg {
    Ptr(DevPtr),
    Null,
    I32(i32),
    I64(i64),
    F32(f32),
}

/// Grid, block and dynamic shared memory of a launch (the kernels use static shared
/// memory only, so `shared` is 0 today).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared: u32,
}

impl Launch {
    pub fn new(grid: [u32; 3], block: u32) -> Self {
        Launch {
            grid,
            block: [block, 1, 1],
            shared: 0,
        }
    }

    pub fn linear(blocks: usize, block: u32) -> Self {
        Self::new([to_u32(blocks.max(1)), 1, 1], block)
    }
}

/// Grid dimensions come from buffer sizes that the forward has already bounded; a
/// value past u32 would be a host bug, and clamping keeps it a wrong launch the
/// kernels' own bounds checks catch rather than a panic.
pub fn to_u32(v: usize) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{call} failed: {error}")]
    Driver { call: &'static str, error: String },
    #[error("out of device memory: {bytes} more bytes wanted ({what})")]
    OutOfMemory { bytes: usize, what: String },
    #[error("no kernel named `{0}` in the compiled modules")]
    NoKernel(String),
    #[error("kernel {kernel}: {message}")]
    Launch { kernel: String, message: String },
    #[error("bad device access: {0}")]
    Bounds(String),
    #[error("the driver refuses the kernels of {module} (SASS from NVRTC {nvrtc}): {error}")]
    Load {
        module: &'static str,
        error: String,
        nvrtc: String,
    },
    #[error("cannot compile the kernels: {0}")]
    Compile(#[from] sparkd_kernels::KernelError),
    #[error("kernel emulator: {0}")]
    Emulator(#[from] sparkd_kernels::emu::EmuError),
    #[error("{0}")]
    Unsupported(String),
}

/// What a device can do for the forward.
pub trait Gpu: Send {
    /// A zeroed buffer of `bytes` bytes; `what` names it in errors.
    fn alloc(&mut self, bytes: usize, what: &str) -> Result<Buf, GpuError>;
    fn free(&mut self, buf: Buf);
    /// Host to device, ordered with the launches before and after it.
    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), GpuError>;
    /// Device to host; waits for the launches before it and for the copy.
    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError>;
    /// `floats` zeroed `f32`s of host memory for what comes back every step:
    /// page-locked on a real GPU, so that [`Gpu::download`]s into it run at the link's
    /// speed; the heap where copies are plain `memcpy`s anyway.
    fn alloc_host_rows(&mut self, floats: usize) -> Result<HostRows, GpuError> {
        Ok(HostRows::heap(floats))
    }
    /// Queues `kernel` with `args` in parameter order.
    fn launch(&mut self, kernel: &str, cfg: Launch, args: &[KArg]) -> Result<(), GpuError>;
    /// From here to [`Gpu::capture_end`], launches are recorded, not run (CUDA stream
    /// capture). Nothing else may be queued meanwhile: copies are refused.
    fn capture_begin(&mut self) -> Result<(), GpuError>;
    /// Ends the recording. Called after every `capture_begin`, even when a launch in
    /// between failed, so the device always leaves capture mode.
    fn capture_end(&mut self) -> Result<GraphId, GpuError>;
    /// Queues the recorded launches, with the arguments they were recorded with: what
    /// changes from step to step must be read from device memory, not passed by value.
    fn graph_launch(&mut self, graph: GraphId) -> Result<(), GpuError>;
    fn graph_free(&mut self, graph: GraphId);
    /// Marks the start of a step (a CUDA event on the real device).
    fn step_begin(&mut self) -> Result<(), GpuError>;
    /// Ends the step: waits for it and returns its duration on the device.
    fn step_end(&mut self) -> Result<Duration, GpuError>;
    /// Turns per-kernel timing on or off (profiling, never serving). While on, every
    /// launch is timed on the device, launch by launch, so the forward must not capture
    /// graphs meanwhile; a launch's time runs from the end of the timed launch before it
    /// (or from the first's start), so it includes any wait between the two.
    fn set_kernel_timing(&mut self, on: bool) -> Result<(), GpuError>;
    /// Time per kernel since the last call, most first; waits for the queued work.
    /// Empty while timing is off.
    fn take_kernel_times(&mut self) -> Result<Vec<KernelTime>, GpuError>;
    /// Device-to-device copy of `bytes` bytes (benchmarks measure bandwidth with it).
    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), GpuError>;
    /// Programmatic dependent launch (kernels/common.cuh, `pdl_enter`): each launch
    /// may start while the kernel before it finishes. Returns whether launches use it
    /// from now on: only where the device and driver take it. Graphs captured before
    /// keep the launches they were captured with.
    fn set_programmatic_launch(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// `name (sm_NN)`.
    fn name(&self) -> String;
    /// (free, total) device memory, when the device can say.
    fn memory(&self) -> Option<(u64, u64)>;
    /// For `Status`, usable from any thread.
    fn report(&self) -> std::sync::Arc<dyn crate::backend::DeviceReport>;
}

/// One kernel's share of a timed stretch of work ([`Gpu::take_kernel_times`]).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    pub kernel: String,
    pub launches: u64,
    pub time: Duration,
}

/// Launches and time per kernel, summed (a device's timer, the emulator's profile, a
/// backend's profile by kind of step).
#[derive(Debug, Default, Clone)]
pub struct KernelTotals(HashMap<String, (u64, Duration)>);

impl KernelTotals {
    pub fn add(&mut self, kernel: &str, launches: u64, time: Duration) {
        let e = self.0.entry(kernel.to_string()).or_default();
        e.0 += launches;
        e.1 += time;
    }

    /// Launches of the kernels whose names start with `prefix`.
    pub fn launches_of(&self, prefix: &str) -> u64 {
        self.0
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, &(n, _))| n)
            .sum()
    }

    /// The totals as [`Gpu::take_kernel_times`] returns them: most time first.
    pub fn sorted(&self) -> Vec<KernelTime> {
        let mut v: Vec<KernelTime> = self
            .0
            .iter()
            .map(|(kernel, &(launches, time))| KernelTime {
                kernel: kernel.clone(),
                launches,
                time,
            })
            .collect();
        v.sort_by(|a, b| b.time.cmp(&a.time).then_with(|| a.kernel.cmp(&b.kernel)));
        v
    }
}

/// Little-endian bytes of f32s (the host and every CUDA device are little-endian).
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

pub fn u32_bytes(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
