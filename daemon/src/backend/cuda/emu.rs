//! [`EmuGpu`]: the [`Gpu`] interface over `sparkd_kernels::emu`, which runs the real
//! kernel sources on the CPU (one emulator process per launch). Buffers are host
//! vectors. It exists so that the whole CUDA forward (buffer layout, launch shapes,
//! argument order, paged-KV indexing) is tested on machines without a GPU; it is far
//! too slow for anything but tiny models.
//!
//! Aliasing is kept honest: when several arguments of one launch point into the same
//! buffer (an in-place kernel, a row of a larger buffer), the buffer is passed once and
//! the other arguments become views of it, so the kernel sees one allocation exactly as
//! on the device, not independent copies.
//!
//! Graphs are recordings of launches with their arguments as given, replayed as they
//! were recorded: a step that passed a per-step value by argument instead of through
//! device memory replays stale, and the graph tests see it, as they would on a GPU.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sparkd_kernels::emu::{Arg, Emulator};

use super::gpu::{Buf, DevPtr, Gpu, GpuError, GraphId, KArg, KernelTime, KernelTotals, Launch};
use crate::backend::DeviceReport;

pub struct EmuGpu {
    emu: &'static Emulator,
    bufs: Vec<Option<Vec<u8>>>,
    step_started: Option<Instant>,
    launches: u64,
    /// Per kernel: launches and wall time in the emulator (tests print where time goes).
    profile: KernelTotals,
    /// The same since the last `take_kernel_times`, while kernel timing is on.
    timed: Option<KernelTotals>,
    /// The launches recorded since `capture_begin`, while capturing.
    capturing: Option<Vec<Recorded>>,
    graphs: Vec<Option<Vec<Recorded>>>,
    /// Called after each host-to-device copy (tests watch the host's memory with it).
    upload_probe: Option<Box<dyn FnMut() + Send>>,
}

struct Recorded {
    kernel: String,
    cfg: Launch,
    args: Vec<KArg>,
}

impl EmuGpu {
    /// Builds (once per process) the emulator; fails without a C++ compiler.
    pub fn new() -> Result<Self, GpuError> {
        Ok(EmuGpu {
            emu: Emulator::get()?,
            bufs: Vec::new(),
            step_started: None,
            launches: 0,
            profile: KernelTotals::default(),
            timed: None,
            capturing: None,
            graphs: Vec::new(),
            upload_probe: None,
        })
    }

    /// Kernel launches so far (tests check which paths ran).
    pub fn launches(&self) -> u64 {
        self.launches
    }

    /// Runs `probe` after every host-to-device copy from now on.
    pub fn probe_uploads(&mut self, probe: impl FnMut() + Send + 'static) {
        self.upload_probe = Some(Box::new(probe));
    }

    /// Launches of the kernels whose names start with `prefix`.
    pub fn launches_of(&self, prefix: &str) -> u64 {
        self.profile.launches_of(prefix)
    }

    /// Launch count and emulator time per kernel, most time first.
    pub fn profile(&self) -> Vec<KernelTime> {
        self.profile.sorted()
    }

    fn buf(&self, p: DevPtr, len: usize) -> Result<&Vec<u8>, GpuError> {
        let b = self
            .bufs
            .get(p.buf.id as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| GpuError::Bounds(format!("buffer {} is not allocated", p.buf.id)))?;
        if p.offset.checked_add(len).is_none_or(|end| end > b.len()) {
            return Err(GpuError::Bounds(format!(
                "{len} bytes at offset {} of a {}-byte buffer",
                p.offset,
                b.len()
            )));
        }
        Ok(b)
    }

    /// Copies are stream work that a capture would take into the graph, and the
    /// forward never means to: refuse them as a broken capture.
    fn not_capturing(&self, what: &str) -> Result<(), GpuError> {
        match self.capturing {
            Some(_) => Err(GpuError::Unsupported(format!(
                "{what} during a graph capture"
            ))),
            None => Ok(()),
        }
    }
}

impl Gpu for EmuGpu {
    fn alloc(&mut self, bytes: usize, _what: &str) -> Result<Buf, GpuError> {
        let id = self.bufs.len() as u32;
        self.bufs.push(Some(vec![0u8; bytes]));
        Ok(Buf { id, bytes })
    }

    fn free(&mut self, buf: Buf) {
        if let Some(b) = self.bufs.get_mut(buf.id as usize) {
            *b = None;
        }
    }

    fn upload(&mut self, dst: DevPtr, src: &[u8]) -> Result<(), GpuError> {
        self.not_capturing("a host-to-device copy")?;
        self.buf(dst, src.len())?;
        if let Some(Some(b)) = self.bufs.get_mut(dst.buf.id as usize) {
            b[dst.offset..dst.offset + src.len()].copy_from_slice(src);
        }
        if let Some(probe) = &mut self.upload_probe {
            probe();
        }
        Ok(())
    }

    fn download(&mut self, src: DevPtr, dst: &mut [u8]) -> Result<(), GpuError> {
        self.not_capturing("a device-to-host copy")?;
        let b = self.buf(src, dst.len())?;
        dst.copy_from_slice(&b[src.offset..src.offset + dst.len()]);
        Ok(())
    }

    fn copy(&mut self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<(), GpuError> {
        let data = self.buf(src, bytes)?[src.offset..src.offset + bytes].to_vec();
        self.upload(dst, &data)
    }

    fn launch(&mut self, kernel: &str, cfg: Launch, args: &[KArg]) -> Result<(), GpuError> {
        if let Some(rec) = self.capturing.as_mut() {
            rec.push(Recorded {
                kernel: kernel.to_string(),
                cfg,
                args: args.to_vec(),
            });
            return Ok(());
        }
        self.launches += 1;
        // Take each distinct buffer out of the table once, in argument order.
        for a in args {
            if let KArg::Ptr(p) = a {
                self.buf(*p, 0)?;
            }
        }
        let mut taken: Vec<(u32, Vec<u8>)> = Vec::new();
        for a in args {
            if let KArg::Ptr(p) = a {
                if !taken.iter().any(|(id, _)| *id == p.buf.id) {
                    let data = self.bufs[p.buf.id as usize].take().unwrap_or_default();
                    taken.push((p.buf.id, data));
                }
            }
        }
        let result = {
            let mut slices: HashMap<u32, &mut [u8]> = taken
                .iter_mut()
                .map(|(id, data)| (*id, data.as_mut_slice()))
                .collect();
            // The argument index that carries each buffer; later ones are views of it.
            let mut owner: HashMap<u32, usize> = HashMap::new();
            let mut emu_args: Vec<Arg<'_>> = Vec::with_capacity(args.len());
            for (i, a) in args.iter().enumerate() {
                emu_args.push(match *a {
                    KArg::Ptr(p) => match owner.get(&p.buf.id) {
                        Some(&arg) => Arg::View {
                            arg,
                            offset: p.offset,
                        },
                        None => {
                            owner.insert(p.buf.id, i);
                            match slices.remove(&p.buf.id) {
                                Some(s) => Arg::BufAt(s, p.offset),
                                None => Arg::Null,
                            }
                        }
                    },
                    KArg::Null => Arg::Null,
                    KArg::I32(v) => Arg::I32(v),
                    KArg::I64(v) => Arg::I64(v),
                    KArg::F32(v) => Arg::F32(v),
                });
            }
            let t = Instant::now();
            let r = self
                .emu
                .launch(kernel, cfg.grid, cfg.block, &mut emu_args)
                .map_err(GpuError::from);
            let took = t.elapsed();
            for totals in std::iter::once(&mut self.profile).chain(self.timed.as_mut()) {
                totals.add(kernel, 1, took);
            }
            r
        };
        for (id, data) in taken {
            self.bufs[id as usize] = Some(data);
        }
        result
    }

    fn capture_begin(&mut self) -> Result<(), GpuError> {
        self.not_capturing("a nested capture")?;
        if self.timed.is_some() {
            // As on the device, whose timing events cannot go into a graph.
            return Err(GpuError::Unsupported(
                "a graph capture while kernel timing is on".into(),
            ));
        }
        self.capturing = Some(Vec::new());
        Ok(())
    }

    fn capture_end(&mut self) -> Result<GraphId, GpuError> {
        let rec = self
            .capturing
            .take()
            .ok_or_else(|| GpuError::Unsupported("capture_end without capture_begin".into()))?;
        self.graphs.push(Some(rec));
        Ok(GraphId(self.graphs.len() as u32 - 1))
    }

    fn graph_launch(&mut self, graph: GraphId) -> Result<(), GpuError> {
        self.not_capturing("a graph launch")?;
        // Taken out for the replay (launch needs `&mut self`) and put back after.
        let rec = self
            .graphs
            .get_mut(graph.0 as usize)
            .and_then(Option::take)
            .ok_or_else(|| GpuError::Unsupported(format!("no graph {}", graph.0)))?;
        let result = rec
            .iter()
            .try_for_each(|r| self.launch(&r.kernel, r.cfg, &r.args));
        self.graphs[graph.0 as usize] = Some(rec);
        result
    }

    fn graph_free(&mut self, graph: GraphId) {
        if let Some(g) = self.graphs.get_mut(graph.0 as usize) {
            *g = None;
        }
    }

    fn step_begin(&mut self) -> Result<(), GpuError> {
        self.step_started = Some(Instant::now());
        Ok(())
    }

    fn step_end(&mut self) -> Result<Duration, GpuError> {
        Ok(self
            .step_started
            .take()
            .map_or(Duration::ZERO, |t| t.elapsed()))
    }

    fn set_kernel_timing(&mut self, on: bool) -> Result<(), GpuError> {
        self.not_capturing("kernel timing")?;
        match (on, self.timed.is_some()) {
            (true, false) => self.timed = Some(KernelTotals::default()),
            (false, _) => self.timed = None,
            (true, true) => {}
        }
        Ok(())
    }

    fn take_kernel_times(&mut self) -> Result<Vec<KernelTime>, GpuError> {
        Ok(self
            .timed
            .as_mut()
            .map(|t| std::mem::take(t).sorted())
            .unwrap_or_default())
    }

    fn name(&self) -> String {
        "kernel emulator (CPU)".into()
    }

    fn memory(&self) -> Option<(u64, u64)> {
        None
    }

    fn report(&self) -> Arc<dyn DeviceReport> {
        Arc::new(EmuReport)
    }
}

struct EmuReport;

impl DeviceReport for EmuReport {
    fn backend(&self) -> &'static str {
        "cuda"
    }

    fn device(&self) -> String {
        "kernel emulator (CPU)".into()
    }
}
