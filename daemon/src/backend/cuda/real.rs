//! [`CudaGpu`]: the [`Gpu`] interface over the CUDA driver API (cudarc, loaded
//! dynamically, so the same binary runs without CUDA). One context (the device's
//! primary one), one stream, every kernel module compiled by NVRTC for the device's
//! architecture (`sparkd_kernels::compile`: SASS, cached) and loaded at start, and a pair
//! of CUDA events around each step for its duration on the device.
//!
//! Programmatic dependent launch (sm_90+): every kernel goes out with the
//! programmatic-stream-serialization attribute, so the GPU may start it while the kernel
//! before it drains; the kernels wait for their inputs themselves (`pdl_enter` in
//! kernels/common.cuh). A start-up probe launches and captures a pair that way first,
//! and a driver that refuses either leaves it off.
//!
//! Graphs: the forward captures decode steps on the stream (thread-local capture mode,
//! so a stray synchronising call on this thread breaks the capture with an error
//! instead of corrupting it) and replays the instantiated graph; what the forward
//! decides to capture is in `forward.rs`.
//!
//! Every `unsafe` block here is a driver call; the invariants they share: the context
//! is bound to the calling thread first (the backend is built on one thread and runs
//! on the engine's), device pointers come from `cuMemAlloc` in this struct and are
//! freed only in `free`/`Drop`, and bounds are checked on the host before each copy.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::result::{self, stream::StreamKind, DriverError};
use cudarc::driver::{sys, CudaContext};
use sparkd_kernels::{names, Arch};

use super::gpu::{Buf, DevPtr, Gpu, GpuError, GraphId, KArg, KernelTime, KernelTotals, Launch};
use super::host_rows::{HostRows, Release};
use crate::backend::DeviceReport;

fn driver(call: &'static str) -> impl Fn(DriverError) -> GpuError {
    move |e| GpuError::Driver {
        call,
        error: e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0)),
    }
}

/// Programmatic dependent launch needs Hopper or newer (`griddepcontrol`).
const PDL_MIN_SM: u32 = 90;

pub struct CudaGpu {
    ctx: Arc<CudaContext>,
    stream: sys::CUstream,
    modules: Vec<sys::CUmodule>,
    functions: HashMap<String, sys::CUfunction>,
    bufs: Vec<Option<(sys::CUdeviceptr, usize)>>,
    start: sys::CUevent,
    end: sys::CUevent,
    name: String,
    arch: Arch,
    /// Parameter storage reused across launches.
    params: Vec<u64>,
    /// Captured graphs and their executable instances, by `GraphId`.
    graphs: Vec<Option<(sys::CUgraph, sys::CUgraphExec)>>,
    /// Per-launch events while kernel timing is on.
    timer: Option<LaunchTimer>,
    /// The device and driver take programmatic dependent launches (the start-up probe
    /// passed), and whether launches use them now.
    pdl_usable: bool,
    pdl_on: bool,
}

/// Kernel timing: `events[0]` is recorded before the first timed launch and
/// `events[i + 1]` after `kernels[i]`, so a launch's time is the gap between its event
/// and the one before. Events are created as needed and reused after each flush.
#[derive(Default)]
struct LaunchTimer {
    events: Vec<sys::CUevent>,
    kernels: Vec<String>,
    totals: KernelTotals,
}

impl LaunchTimer {
    /// Flushing every this many launches keeps the pool of events bounded.
    const MAX_PENDING: usize = 4096;

    /// Records event `i` on `stream`, creating it first if the pool is short.
    fn record(&mut self, i: usize, stream: sys::CUstream) -> Result<(), GpuError> {
        if i == self.events.len() {
            let e = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                .map_err(driver("cuEventCreate"))?;
            self.events.push(e);
        }
        // SAFETY: the event was created above or by an earlier call and is destroyed
        // only in `destroy`; the stream is the caller's live stream.
        unsafe { result::event::record(self.events[i], stream) }.map_err(driver("cuEventRecord"))
    }

    /// Waits for the recorded launches and adds their times to the totals.
    fn flush(&mut self) -> Result<(), GpuError> {
        let n = self.kernels.len();
        if n == 0 {
            return Ok(());
        }
        // SAFETY: events 0..=n were recorded, in order, on one stream; once the last
        // has completed, so have all before it.
        unsafe {
            result::event::synchronize(self.events[n]).map_err(driver("cuEventSynchronize"))?;
            for (i, kernel) in self.kernels.drain(..).enumerate() {
                let ms = result::event::elapsed(self.events[i], self.events[i + 1])
                    .map_err(driver("cuEventElapsedTime"))?;
                let took = Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3);
                self.totals.add(&kernel, 1, took);
            }
        }
        Ok(())
    }

    /// Releases the events (context bound by the caller, stream drained).
    fn destroy(&mut self) {
        for e in self.events.drain(..) {
            // SAFETY: each event was created by `record` and is destroyed once here.
            let _ = unsafe { result::event::destroy(e) };
        }
    }
}

// SAFETY: the raw driver handles (stream, modules, functions, events) belong to this
// struct and are used only through `&mut self`, i.e. by one thread at a time, which
// binds the context before every driver call; the driver API itself is thread-safe.
unsafe impl Send for CudaGpu {}

impl CudaGpu {
    /// Opens GPU `ordinal` and loads every kernel compiled for `arch`. The caller has
    /// probed the device (`device::probe`), so the driver library is known to exist;
    /// this checks again rather than let cudarc panic.
    pub fn new(ordinal: usize, arch: Arch) -> Result<Self, GpuError> {
        // SAFETY: a dlopen probe of the driver library, nothing else.
        if !unsafe { sys::is_culib_present() } {
            return Err(GpuError::Unsupported(
                "no CUDA device: libcuda.so.1 cannot be loaded".into(),
            ));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver("cuDevicePrimaryCtxRetain"))?;
        let name = ctx.name().map_err(driver("cuDeviceGetName"))?;
        let kernels = sparkd_kernels::compile(&arch.to_string())?;
        let stream =
            result::stream::create(StreamKind::NonBlocking).map_err(driver("cuStreamCreate"))?;
        let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(driver("cuEventCreate"))?;
        let end = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(driver("cuEventCreate"))?;
        let mut gpu = CudaGpu {
            ctx,
            stream,
            modules: Vec::new(),
            functions: HashMap::new(),
            bufs: Vec::new(),
            start,
            end,
            name,
            arch,
            params: Vec::new(),
            graphs: Vec::new(),
            timer: None,
            pdl_usable: false,
            pdl_on: false,
        };
        for module in &kernels.modules {
            // SAFETY: a cubin (checked by KernelImage::new to be a CUDA ELF image for
            // this architecture) that outlives the call; the driver copies it.
            let m = unsafe { result::module::load_data(module.cubin().as_ptr() as *const c_void) }
                .map_err(|e| GpuError::Load {
                    module: module.module(),
                    error: driver("cuModuleLoadData")(e).to_string(),
                    nvrtc: kernels.nvrtc.to_string(),
                })?;
            gpu.modules.push(m);
            for entry in module.entry_points() {
                let c = CString::new(entry).map_err(|_| GpuError::NoKernel(entry.into()))?;
                // SAFETY: `m` was just loaded and is unloaded only in Drop.
                let f = unsafe { result::module::get_function(m, c) }
                    .map_err(driver("cuModuleGetFunction"))?;
                gpu.functions.insert(entry.to_string(), f);
            }
        }
        gpu.pdl_usable = arch.sm() >= PDL_MIN_SM
            && match gpu.probe_programmatic_launch() {
                Ok(()) => true,
                Err(reason) => {
                    tracing::warn!(%reason, "programmatic dependent launch refused; kernels launch one after another");
                    false
                }
            };
        tracing::info!(
            device = %gpu.name,
            arch = %gpu.arch,
            kernels = gpu.functions.len(),
            programmatic_launch = gpu.pdl_usable,
            "CUDA kernels loaded"
        );
        Ok(gpu)
    }

    /// Two kernels that touch no memory, launched programmatically dependent, then
    /// captured that way into a graph and replayed: what the forward will do.
    fn probe_programmatic_launch(&mut self) -> Result<(), GpuError> {
        self.bind()?;
        // swiglu over zero elements: a grid-stride loop that reads nothing.
        let args = [KArg::Null, KArg::Null, KArg::Null, KArg::I64(0)];
        let cfg = Launch::linear(1, 32);
        self.pdl_on = true;
        let probe = (|| {
            for _ in 0..2 {
                self.launch(names::SWIGLU, cfg, &args)?;
            }
            self.synchronize()?;
            self.capture_begin()?;
            let recorded = (0..2).try_for_each(|_| self.launch(names::SWIGLU, cfg, &args));
            let graph = match (recorded, self.capture_end()) {
                (Ok(()), captured) => captured?,
                (Err(e), captured) => {
                    if let Ok(g) = captured {
                        self.graph_free(g);
                    }
                    return Err(e);
                }
            };
            let replayed = self.graph_launch(graph).and_then(|()| self.synchronize());
            self.graph_free(graph);
            replayed
        })();
        self.pdl_on = false;
        probe
    }

    fn synchronize(&self) -> Result<(), GpuError> {
        // SAFETY: the stream was created in `new` and lives until Drop.
        unsafe { result::stream::synchronize(self.stream) }.map_err(driver("cuStreamSynchronize"))
    }

    fn bind(&self) -> Result<(), GpuError> {
        self.ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
    }

    /// The raw address of `p`, after checking that `len` bytes there are allocated.
    fn addr(&self, p: DevPtr, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        let (base, size) = self
            .bufs
            .get(p.buf.id as usize)
            .copied()
            .flatten()
            .ok_or_else(|| GpuError::Bounds(format!("buffer {} is not allocated", p.buf.id)))?;
        if p.offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(GpuError::Bounds(format!(
                "{len} bytes at offset {} of a {size}-byte buffer",
                p.offset
            )));
        }
        Ok(base + p.offset as u64)
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }
}

impl Gpu for CudaGpu {
    fn alloc(&mut self, bytes: usize, what: &str) -> Result<Buf, GpuError> {
        self.bind()?;
        // cuMemAlloc refuses 0 bytes; an empty tensor still gets a valid address.
        let size = bytes.max(16);
        // SAFETY: context bound; the memory is zeroed below before any use.
        let ptr = unsafe { result::malloc_sync(size) }.map_err(|e| {
            if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                GpuError::OutOfMemory {
                    bytes: size,
                    what: what.to_string(),
                }
            } else {
                driver("cuMemAlloc")(e)
            }
        })?;
        // SAFETY: `ptr` holds `size` bytes just allocated; ordered on our stream.
        unsafe { result::memset_d8_async(ptr, 0, size, self.stream) }
            .map_err(driver("cuMemsetD8Async"))?;
        let id = self.bufs.len() as u32;
        self.bufs.push(Some((ptr, size)));
        Ok(Buf { id, bytes })
    }

    fn free(&mut self, buf: Buf) {
        if let Some(slot) = self.bufs.get_mut(buf.id as usize) {
            if let Some((ptr, _)) = slot.take() {
                if self.ctx.bind_to_thread().is_ok() {
                    // SAFETY: context bound; the stream is drained first so no queued
                    // kernel still uses the memory; `ptr` came from malloc_sync.
                    unsafe {
                        let _ = result::stream::synchronize(self.stream);
                        let _ = result::free_sync(ptr);
                    }
                }
            }
        }
    }

    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), GpuError> {
        self.bind()?;
        let addr = self.addr(dst, src.len())?;
        // SAFETY: bounds checked above. From pageable memory the driver stages `src`
        // before returning, so the host buffer may be reused at once.
        unsafe { result::memcpy_htod_async(addr, src, self.stream) }
            .map_err(driver("cuMemcpyHtoDAsync"))
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.bind()?;
        let addr = self.addr(src, dst.len())?;
        // SAFETY: bounds checked above; the stream is synchronised before `dst` is
        // touched again, so the copy has landed when this returns (into page-locked
        // memory, `HostRows`, it is truly asynchronous until then).
        unsafe {
            result::memcpy_dtoh_async(dst, addr, self.stream)
                .map_err(driver("cuMemcpyDtoHAsync"))?;
            result::stream::synchronize(self.stream).map_err(driver("cuStreamSynchronize"))
        }
    }

    fn alloc_host_rows(&mut self, floats: usize) -> Result<HostRows, GpuError> {
        if floats == 0 {
            return Ok(HostRows::heap(0));
        }
        self.bind()?;
        let what = "host logit rows";
        let bytes = floats
            .checked_mul(4)
            .ok_or_else(|| GpuError::Bounds(format!("{floats} floats of {what}")))?;
        // SAFETY: context bound; the memory is zeroed below before anything reads it.
        let raw = match unsafe { result::malloc_host(bytes, 0) } {
            Ok(raw) => raw,
            Err(e) => {
                // Page-locked memory only makes the copy faster: where the driver will not
                // pin (a sandbox, a locked-memory limit, pinned memory used up), the rows
                // go to ordinary memory, which the copies read as well, a little slower.
                tracing::warn!(
                    bytes,
                    error = ?e.0,
                    "cannot page-lock the host logit rows; using ordinary memory"
                );
                return Ok(HostRows::heap(floats));
            }
        };
        let ptr = NonNull::new(raw.cast::<f32>())
            .ok_or_else(|| GpuError::Bounds("cuMemHostAlloc returned null".into()))?;
        // SAFETY: `bytes` writable bytes just allocated (page-aligned), ours alone.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, floats) };
        // The context stays retained while the memory lives, whatever goes first.
        let ctx = self.ctx.clone();
        let release: Release = Box::new(move |p, _| {
            if ctx.bind_to_thread().is_ok() {
                // SAFETY: `p` came from cuMemHostAlloc in this context and its
                // HostRows is gone; every download into it was waited for.
                let _ = unsafe { result::free_host(p.as_ptr().cast()) };
            }
        });
        // SAFETY: `ptr` holds `floats` zeroed, aligned f32s that only this HostRows
        // uses, and `release` frees them.
        Ok(unsafe { HostRows::from_raw(ptr, floats, release) })
    }

    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), GpuError> {
        self.bind()?;
        let (d, s) = (self.addr(dst, bytes)?, self.addr(src, bytes)?);
        // SAFETY: both ranges checked above.
        unsafe { result::memcpy_dtod_async(d, s, bytes, self.stream) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn launch(&mut self, kernel: &str, cfg: Launch, args: &[KArg]) -> Result<(), GpuError> {
        self.bind()?;
        let f = *self
            .functions
            .get(kernel)
            .ok_or_else(|| GpuError::NoKernel(kernel.to_string()))?;
        // Each parameter in its own 8-byte slot; the driver reads as many bytes of each
        // as the kernel's signature says (4 for int/float, 8 for pointers and i64), and
        // the host is little-endian, so the low bytes hold 32-bit values.
        self.params.clear();
        for a in args {
            self.params.push(match *a {
                KArg::Ptr(p) => self.addr(p, 0)?,
                KArg::Null => 0,
                KArg::I32(v) => v as u32 as u64,
                KArg::I64(v) => v as u64,
                KArg::F32(v) => v.to_bits() as u64,
            });
        }
        let mut ptrs: Vec<*mut c_void> = self
            .params
            .iter_mut()
            .map(|p| p as *mut u64 as *mut c_void)
            .collect();
        if let Some(t) = self.timer.as_mut() {
            if t.kernels.is_empty() {
                t.record(0, self.stream)?;
            }
        }
        // Timed launches keep their events between them, which would serialise
        // them anyway.
        let launched = if self.pdl_on && self.timer.is_none() {
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value: sys::CUlaunchAttributeValue { pad: [0; 64] },
            };
            attr.value.programmaticStreamSerializationAllowed = 1;
            let config = sys::CUlaunchConfig {
                gridDimX: cfg.grid[0],
                gridDimY: cfg.grid[1],
                gridDimZ: cfg.grid[2],
                blockDimX: cfg.block[0],
                blockDimY: cfg.block[1],
                blockDimZ: cfg.block[2],
                sharedMemBytes: cfg.shared,
                hStream: self.stream,
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as below, and `config` and the attribute it points at outlive
            // the call (the driver copies them).
            unsafe {
                sys::cuLaunchKernelEx(&config, f, ptrs.as_mut_ptr(), std::ptr::null_mut()).result()
            }
            .map_err(driver("cuLaunchKernelEx"))
        } else {
            // SAFETY: `f` is a function of a loaded module; `ptrs` points at one value
            // per kernel parameter, alive until cuLaunchKernel returns (it copies
            // them); the buffers the pointers address are allocated and stay so until
            // `free`, which drains the stream first.
            unsafe {
                result::launch_kernel(
                    f,
                    (cfg.grid[0], cfg.grid[1], cfg.grid[2]),
                    (cfg.block[0], cfg.block[1], cfg.block[2]),
                    cfg.shared,
                    self.stream,
                    &mut ptrs,
                )
            }
            .map_err(driver("cuLaunchKernel"))
        };
        launched.map_err(|e| GpuError::Launch {
            kernel: kernel.to_string(),
            message: e.to_string(),
        })?;
        if let Some(t) = self.timer.as_mut() {
            t.record(t.kernels.len() + 1, self.stream)?;
            t.kernels.push(kernel.to_string());
            if t.kernels.len() >= LaunchTimer::MAX_PENDING {
                t.flush()?;
            }
        }
        Ok(())
    }

    fn capture_begin(&mut self) -> Result<(), GpuError> {
        if self.timer.is_some() {
            // Its events would be recorded into the graph, not around the launches.
            return Err(GpuError::Unsupported(
                "a graph capture while kernel timing is on".into(),
            ));
        }
        self.bind()?;
        // SAFETY: the stream was created in `new` and lives until Drop.
        unsafe {
            result::stream::begin_capture(
                self.stream,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
        }
        .map_err(driver("cuStreamBeginCapture"))
    }

    fn capture_end(&mut self) -> Result<GraphId, GpuError> {
        self.bind()?;
        // SAFETY: the stream is ours; ending a capture that an error invalidated still
        // returns the stream to normal mode (and the error, which is passed on). The
        // graph is destroyed here if it cannot be instantiated, else in `graph_free`
        // or Drop.
        unsafe {
            let graph =
                result::stream::end_capture(self.stream).map_err(driver("cuStreamEndCapture"))?;
            if graph.is_null() {
                return Err(GpuError::Unsupported(
                    "the stream capture recorded no graph".into(),
                ));
            }
            match result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) {
                Ok(exec) => {
                    self.graphs.push(Some((graph, exec)));
                    Ok(GraphId(self.graphs.len() as u32 - 1))
                }
                Err(e) => {
                    let _ = result::graph::destroy(graph);
                    Err(driver("cuGraphInstantiate")(e))
                }
            }
        }
    }

    fn graph_launch(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.bind()?;
        let (_, exec) = self
            .graphs
            .get(graph.0 as usize)
            .copied()
            .flatten()
            .ok_or_else(|| GpuError::Unsupported(format!("no graph {}", graph.0)))?;
        // SAFETY: `exec` was instantiated in `capture_end` and not yet destroyed; the
        // buffers its kernels address are alive: the forward drops its graphs before
        // it frees or reallocates any buffer they use.
        unsafe { result::graph::launch(exec, self.stream) }.map_err(driver("cuGraphLaunch"))
    }

    fn graph_free(&mut self, graph: GraphId) {
        let Some((g, exec)) = self.graphs.get_mut(graph.0 as usize).and_then(Option::take) else {
            return;
        };
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: context bound; the stream is drained first so no queued launch of
            // the graph is running; each handle is destroyed once (the slot was taken).
            unsafe {
                let _ = result::stream::synchronize(self.stream);
                let _ = result::graph::exec_destroy(exec);
                let _ = result::graph::destroy(g);
            }
        }
    }

    fn step_begin(&mut self) -> Result<(), GpuError> {
        self.bind()?;
        // SAFETY: both handles were created in `new` and live until Drop.
        unsafe { result::event::record(self.start, self.stream) }.map_err(driver("cuEventRecord"))
    }

    fn step_end(&mut self) -> Result<Duration, GpuError> {
        self.bind()?;
        // SAFETY: events and stream created in `new`; `start` was recorded on the
        // same stream before `end`.
        let ms = unsafe {
            result::event::record(self.end, self.stream).map_err(driver("cuEventRecord"))?;
            result::event::synchronize(self.end).map_err(driver("cuEventSynchronize"))?;
            result::event::elapsed(self.start, self.end).map_err(driver("cuEventElapsedTime"))?
        };
        Ok(Duration::from_secs_f64(ms.max(0.0) as f64 / 1e3))
    }

    fn set_kernel_timing(&mut self, on: bool) -> Result<(), GpuError> {
        self.bind()?;
        match (on, self.timer.take()) {
            (true, t) => self.timer = Some(t.unwrap_or_default()),
            (false, Some(mut t)) => {
                // SAFETY: context bound; the stream is ours. Drained so that no
                // recorded event is pending when it is destroyed.
                unsafe { result::stream::synchronize(self.stream) }
                    .map_err(driver("cuStreamSynchronize"))?;
                t.destroy();
            }
            (false, None) => {}
        }
        Ok(())
    }

    fn take_kernel_times(&mut self) -> Result<Vec<KernelTime>, GpuError> {
        self.bind()?;
        let Some(t) = self.timer.as_mut() else {
            return Ok(Vec::new());
        };
        t.flush()?;
        Ok(std::mem::take(&mut t.totals).sorted())
    }

    fn set_programmatic_launch(&mut self, on: bool) -> bool {
        self.pdl_on = on && self.pdl_usable;
        self.pdl_on
    }

    fn name(&self) -> String {
        format!("{} ({})", self.name, self.arch)
    }

    fn memory(&self) -> Option<(u64, u64)> {
        self.ctx
            .mem_get_info()
            .ok()
            .map(|(free, total)| (free as u64, total as u64))
    }

    fn report(&self) -> Arc<dyn DeviceReport> {
        Arc::new(CudaReport {
            ctx: self.ctx.clone(),
            name: self.name(),
        })
    }
}

impl Drop for CudaGpu {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // SAFETY: context bound; every handle was created in `new` or `alloc` and is
        // released exactly once here, after the stream has drained.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            if let Some(mut t) = self.timer.take() {
                t.destroy();
            }
            for (g, exec) in self.graphs.drain(..).flatten() {
                let _ = result::graph::exec_destroy(exec);
                let _ = result::graph::destroy(g);
            }
            for (ptr, _) in self.bufs.drain(..).flatten() {
                let _ = result::free_sync(ptr);
            }
            for m in self.modules.drain(..) {
                let _ = result::module::unload(m);
            }
            let _ = result::event::destroy(self.start);
            let _ = result::event::destroy(self.end);
            let _ = result::stream::destroy(self.stream);
        }
    }
}

/// `Status`'s view of the device: its name and, read when asked, its free memory.
struct CudaReport {
    ctx: Arc<CudaContext>,
    name: String,
}

impl DeviceReport for CudaReport {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn device(&self) -> String {
        const GIB: f64 = (1u64 << 30) as f64;
        match self.ctx.mem_get_info() {
            Ok((free, total)) => format!(
                "{} · {:.1} of {:.1} GiB free",
                self.name,
                free as f64 / GIB,
                total as f64 / GIB
            ),
            Err(_) => self.name.clone(),
        }
    }
}
