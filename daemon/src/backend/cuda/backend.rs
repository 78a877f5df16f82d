//! [`CudaBackend`]: the model on a [`Gpu`] (the real device, or the emulator in tests)
//! behind the engine's [`Backend`] interface. It owns the device weights, the paged KV
//! cache on the device (the CPU cache's layout and block design: one shared
//! [`BlockPool`], per-sequence [`BlockTable`]s, `[layer][block][slot][kv_dim]`; in f16 by
//! default where the CPU keeps f32: half the memory and half the bytes attention reads,
//! for an error well inside the parity bar), the step's device scratch and the host
//! copy of the logits the engine samples from.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sparkd_kernels::names::KvType;

use super::gpu::{u32_bytes, Buf, Gpu, GpuError, KernelTime, KernelTotals};
use super::graphs::Graphs;
use super::host_rows::HostRows;
use super::weights::DevWeights;
use crate::backend::cpu::ThreadPool;
use crate::backend::{Backend, BackendError, DeviceReport, HostThreads};
use crate::model::config::ModelConfig;
use crate::model::{BlockPool, Model, SeqInput, BLOCK_TOKENS};

// Logits are downloaded straight into host f32s (`fetch_outputs`), and uploads write
// host integers as little-endian bytes: the host must be little-endian like the GPU.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the CUDA backend needs a little-endian host"
);

/// Settings of the CUDA backend.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// KV cache positions on the device (rounded up to whole blocks).
    pub kv_tokens: usize,
    /// Steps with at least this many tokens run their matrices through dequantize +
    /// tensor-core GEMM (prefill chunks). Below it the tensor-core mat-mul reads each
    /// quantized weight once per 64 rows, where the GEMM path writes and reads an f16
    /// copy of every matrix (7x the bytes of a 4.5-bit weight) once per step: 256 puts
    /// the crossover at about four mat-mul launches (an estimate, not a measurement).
    pub gemm_min_tokens: usize,
    /// Steps with at least this many tokens (and fewer than `gemm_min_tokens`) run
    /// their matrices through the tensor-core mat-mul with in-register dequantization;
    /// smaller ones through the f32 mat-vec. Four: from there the mat-vec's multiplies
    /// (an FMA and a 4-byte activation read per weight and row), not the weight reads,
    /// would bound the step (an estimate from instruction counts, not a measurement).
    pub mmq_min_tokens: usize,
    /// Largest f16 weight scratch the GEMM path may take; matrices above it (the output
    /// head of a large vocabulary, say) take the tensor-core mat-mul instead.
    pub gemm_scratch_max_bytes: usize,
    /// Capture decode steps as CUDA graphs, one per padded shape, and replay them.
    pub graphs: bool,
    /// Launch each kernel programmatically dependent on the one before it (sm_90+,
    /// where the driver takes it): the GPU starts it, and its weight prefetch, while
    /// the kernel before drains, instead of after (kernels/common.cuh, `pdl_enter`).
    pub pdl: bool,
    /// Element type of the device KV cache.
    pub kv_type: KvType,
    /// Weights go up from the file in chunks of this many bytes, each chunk's pages of
    /// the mapping given back after it: the host's peak during the upload.
    pub upload_chunk_bytes: usize,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            kv_tokens: 16 * 1024,
            gemm_min_tokens: 256,
            mmq_min_tokens: 4,
            gemm_scratch_max_bytes: 512 << 20,
            graphs: true,
            pdl: true,
            kv_type: KvType::F16,
            upload_chunk_bytes: 64 << 20,
        }
    }
}

/// Device scratch of a step, grown on demand and kept.
#[derive(Default)]
pub(super) struct Scratch {
    pub x: Option<Buf>,
    pub q: Option<Buf>,
    pub k: Option<Buf>,
    pub v: Option<Buf>,
    pub attn: Option<Buf>,
    pub gate: Option<Buf>,
    pub up: Option<Buf>,
    pub last: Option<Buf>,
    pub logits: Option<Buf>,
    pub argmax: Option<Buf>,
    /// Greedy rows' logit bias: row starts, token ids, values (`launch_logit_bias`).
    pub bias: Option<Buf>,
    pub meta: Option<Buf>,
    pub part_o: Option<Buf>,
    pub part_ml: Option<Buf>,
    pub a16: Option<Buf>,
    pub h16: Option<Buf>,
    pub w16: Option<Buf>,
}

/// A buffer of at least `bytes` in `slot`, reallocated (contents lost) when too small.
pub(super) fn ensure(
    gpu: &mut dyn Gpu,
    slot: &mut Option<Buf>,
    bytes: usize,
    what: &str,
) -> Result<Buf, GpuError> {
    match *slot {
        Some(b) if b.bytes >= bytes => Ok(b),
        old => {
            if let Some(b) = old {
                gpu.free(b);
                *slot = None;
            }
            // Round up so that slowly growing steps do not reallocate every time.
            let b = gpu.alloc(bytes.max(16).next_power_of_two(), what)?;
            *slot = Some(b);
            Ok(b)
        }
    }
}

pub struct CudaBackend<G: Gpu> {
    pub(super) gpu: G,
    pub(super) cfg: ModelConfig,
    pub(super) w: DevWeights,
    pub(super) pool: BlockPool,
    pub(super) k_cache: Buf,
    pub(super) v_cache: Buf,
    pub(super) scratch: Scratch,
    pub(super) opts: CudaOptions,
    /// The last step's device picks by logit row: `Some` for rows the batch marked
    /// greedy, whose logits stay on the device.
    pub(super) picks: Vec<Option<u32>>,
    /// Host threads for the engine's sampling (`Backend::logit_rows_mut`).
    host_pool: OnceLock<ThreadPool>,
    /// Host copy of the last step's logits: its first `logit_rows` rows of the
    /// vocabulary (page-locked on a GPU; grown, never shrunk).
    pub(super) logits: HostRows,
    pub(super) logit_rows: usize,
    report: Arc<dyn DeviceReport>,
    /// Rows of the last step that ran through the GEMM path (tests check both paths).
    pub(super) gemm_steps: u64,
    pub(super) graphs: Graphs,
    /// Per-kernel device times while a kernel profile is being taken.
    pub(super) profile: Option<ProfileTotals>,
}

/// Per-kernel device time by kind of step, taken between
/// [`CudaBackend::kernel_profile_begin`] and [`CudaBackend::kernel_profile_end`].
#[derive(Debug, Default, Clone)]
pub struct KernelProfile {
    /// Steps where every sequence brought one token, and their kernels, most time first.
    pub decode_steps: u64,
    pub decode: Vec<KernelTime>,
    /// The other steps (prefill chunks, mixed steps).
    pub prefill_steps: u64,
    pub prefill: Vec<KernelTime>,
}

/// Running totals behind a [`KernelProfile`]: index 0 decode steps, 1 the others.
#[derive(Debug, Default)]
pub(super) struct ProfileTotals {
    steps: [u64; 2],
    kernels: [KernelTotals; 2],
}

impl ProfileTotals {
    pub(super) fn add_step(&mut self, decode: bool, times: Vec<KernelTime>) {
        let i = usize::from(!decode);
        self.steps[i] += 1;
        for t in times {
            self.kernels[i].add(&t.kernel, t.launches, t.time);
        }
    }

    fn into_profile(self) -> KernelProfile {
        let [decode, prefill] = self.kernels;
        KernelProfile {
            decode_steps: self.steps[0],
            decode: decode.sorted(),
            prefill_steps: self.steps[1],
            prefill: prefill.sorted(),
        }
    }
}

impl<G: Gpu> CudaBackend<G> {
    /// Uploads `model`'s weights to `gpu` and allocates the KV cache there.
    pub fn new(model: &Model, mut gpu: G, mut opts: CudaOptions) -> Result<Self, GpuError> {
        let cfg = model.config.clone();
        opts.pdl = gpu.set_programmatic_launch(opts.pdl);
        let w = DevWeights::upload(&mut gpu, model, opts.upload_chunk_bytes)?;
        let pool = BlockPool::for_tokens(opts.kv_tokens.max(BLOCK_TOKENS));
        let kv_bytes =
            cfg.n_layers * pool.total_blocks() * BLOCK_TOKENS * cfg.kv_dim() * opts.kv_type.bytes();
        let k_cache = gpu.alloc(kv_bytes, "KV cache keys")?;
        let v_cache = gpu.alloc(kv_bytes, "KV cache values")?;
        let report = Arc::new(ModelOnDevice {
            device: gpu.report(),
            weights_bytes: w.bytes,
            kv_bytes: 2 * kv_bytes as u64,
            kv_type: opts.kv_type,
        });
        tracing::info!(
            device = %gpu.name(),
            weights_mib = w.bytes >> 20,
            kv_tokens = pool.total_blocks() * BLOCK_TOKENS,
            kv_mib = (2 * kv_bytes) >> 20,
            kv_type = ?opts.kv_type,
            programmatic_launch = opts.pdl,
            "model uploaded to the device"
        );
        Ok(CudaBackend {
            gpu,
            cfg,
            w,
            pool,
            k_cache,
            v_cache,
            scratch: Scratch::default(),
            opts,
            logits: HostRows::heap(0),
            logit_rows: 0,
            picks: Vec::new(),
            host_pool: OnceLock::new(),
            report,
            gemm_steps: 0,
            graphs: Graphs::default(),
            profile: None,
        })
    }

    pub fn gpu(&self) -> &G {
        &self.gpu
    }

    pub fn gpu_mut(&mut self) -> &mut G {
        &mut self.gpu
    }

    /// The device, the model's buffers on it left allocated (tests read its counters).
    pub fn into_gpu(self) -> G {
        self.gpu
    }

    /// Bytes of weights one decode step reads.
    pub fn weight_bytes_per_step(&self) -> u64 {
        self.w.bytes_per_step
    }

    /// Bytes of KV cache per position (all layers, keys and values).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.cfg.n_layers * self.cfg.kv_dim() * self.opts.kv_type.bytes()
    }

    /// Steps so far whose matrices went through the dequantize + GEMM path.
    pub fn gemm_steps(&self) -> u64 {
        self.gemm_steps
    }

    /// Decode graphs captured and replayed so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        (self.graphs.captured, self.graphs.replayed)
    }

    /// Starts timing every kernel launch on the device, per kind of step, for
    /// `sparkd bench --profile`. Decode steps run launch by launch meanwhile, since a
    /// graph's launches cannot be timed one by one: a profile shows where a step's
    /// device time goes, not the step time with graphs.
    pub fn kernel_profile_begin(&mut self) -> Result<(), GpuError> {
        self.gpu.set_kernel_timing(true)?;
        self.gpu.take_kernel_times()?;
        self.profile = Some(ProfileTotals::default());
        Ok(())
    }

    /// Stops timing and returns what the steps since `kernel_profile_begin` spent.
    pub fn kernel_profile_end(&mut self) -> Result<KernelProfile, GpuError> {
        let totals = self.profile.take().unwrap_or_default();
        self.gpu.set_kernel_timing(false)?;
        Ok(totals.into_profile())
    }

    /// Turns decode graphs on or off (benchmarks compare the two).
    pub fn set_graphs(&mut self, on: bool) {
        self.opts.graphs = on;
        if !on {
            self.graphs.clear(&mut self.gpu);
        }
    }

    /// Turns programmatic dependent launch on or off (benchmarks compare the two) and
    /// returns whether it is on: only where the device takes it. Captured graphs hold
    /// the old launches, so they go.
    pub fn set_pdl(&mut self, on: bool) -> bool {
        let now = self.gpu.set_programmatic_launch(on);
        if now != self.opts.pdl {
            self.opts.pdl = now;
            self.graphs.clear(&mut self.gpu);
        }
        now
    }

    /// Whether kernels launch programmatically dependent ([`CudaOptions::pdl`]).
    pub fn pdl(&self) -> bool {
        self.opts.pdl
    }

    /// Sets [`CudaOptions::mmq_min_tokens`] and [`CudaOptions::gemm_min_tokens`]
    /// (`usize::MAX` turns a path off), for benchmarks and parity runs that compare the
    /// paths. Captured graphs hold the old kernels, so they go.
    pub fn set_matmul_thresholds(&mut self, mmq_min_tokens: usize, gemm_min_tokens: usize) {
        let now = (self.opts.mmq_min_tokens, self.opts.gemm_min_tokens);
        if now != (mmq_min_tokens, gemm_min_tokens) {
            self.opts.mmq_min_tokens = mmq_min_tokens;
            self.opts.gemm_min_tokens = gemm_min_tokens;
            self.graphs.clear(&mut self.gpu);
        }
    }

    /// Queues the addition of each row's bias (`None` rows have none) to the step's
    /// device logits, before [`Self::launch_argmax`]: greedy requests with a
    /// `logit_bias` keep their picks on the device too. Nothing when no row has one.
    pub(super) fn launch_logit_bias(
        &mut self,
        rows: &[Option<&[(u32, f32)]>],
    ) -> Result<(), GpuError> {
        let entries: usize = rows.iter().flatten().map(|b| b.len()).sum();
        let Some(logits) = self.scratch.logits.filter(|_| entries > 0) else {
            return Ok(());
        };
        // One upload: row starts (rows + 1), then the ids, then the values.
        let mut blob = Vec::with_capacity((rows.len() + 1 + 2 * entries) * 4);
        let mut start = 0i32;
        blob.extend(start.to_le_bytes());
        for bias in rows {
            start += bias.map_or(0, |b| b.len()) as i32;
            blob.extend(start.to_le_bytes());
        }
        for &(id, _) in rows.iter().flatten().copied().flatten() {
            // Ids are inside the vocabulary (validated); one past i32 would be skipped.
            blob.extend(i32::try_from(id).unwrap_or(i32::MAX).to_le_bytes());
        }
        for &(_, value) in rows.iter().flatten().copied().flatten() {
            blob.extend(value.to_le_bytes());
        }
        let buf = ensure(
            &mut self.gpu,
            &mut self.scratch.bias,
            blob.len(),
            "logit bias",
        )?;
        self.gpu.upload(buf.ptr(), &blob)?;
        let ids = buf.at((rows.len() + 1) * 4);
        super::ops::logit_bias(
            &mut self.gpu,
            logits.ptr(),
            rows.len(),
            self.cfg.vocab_size,
            buf.ptr(),
            ids,
            ids.offset_by(entries * 4),
        )
    }

    /// Queues the greedy picks of the first `rows` logit rows (argmax.cu: the CPU
    /// sampler's rule) into the `argmax` scratch.
    pub(super) fn launch_argmax(&mut self, rows: usize) -> Result<(), GpuError> {
        let Some(logits) = self.scratch.logits.filter(|_| rows > 0) else {
            return Ok(());
        };
        let out = ensure(&mut self.gpu, &mut self.scratch.argmax, rows * 4, "argmax")?;
        super::ops::argmax(
            &mut self.gpu,
            logits.ptr(),
            rows,
            self.cfg.vocab_size,
            out.ptr(),
        )
    }

    /// The picks [`Self::launch_argmax`] queued, once the device has them.
    fn download_picks(&mut self, rows: usize) -> Result<Vec<u32>, GpuError> {
        let Some(out) = self.scratch.argmax.filter(|_| rows > 0) else {
            return Ok(Vec::new());
        };
        let mut bytes = vec![0u8; rows * 4];
        self.gpu.download(out.ptr(), &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Greedy picks of every logit row of the last step, computed on the device.
    pub fn device_argmax(&mut self) -> Result<Vec<u32>, GpuError> {
        let rows = self.logit_rows;
        self.launch_argmax(rows)?;
        self.download_picks(rows)
    }

    /// Hands the step's outputs to the host: for each logit row, its pick where
    /// `greedy` (the argmax the step queued, 4 bytes) and else the whole row of logits,
    /// into the host buffer the engine reads (one copy per run of such rows).
    pub(super) fn fetch_outputs(&mut self, greedy: &[bool]) -> Result<(), GpuError> {
        let (rows, vocab) = (greedy.len(), self.cfg.vocab_size);
        self.logit_rows = 0;
        if self.logits.len() < rows * vocab {
            // Page-locking is slow (the driver pins every page): grow in powers of two
            // rows, so that a server reaches its largest batch in a few steps.
            let floats = rows.next_power_of_two() * vocab;
            self.logits = self.gpu.alloc_host_rows(floats)?;
        }
        self.logit_rows = rows;
        self.picks.clear();
        self.picks.resize(rows, None);
        if rows == 0 {
            return Ok(());
        }
        if greedy.contains(&true) {
            let picks = self.download_picks(rows)?;
            for (slot, (&g, pick)) in self.picks.iter_mut().zip(greedy.iter().zip(picks)) {
                *slot = g.then_some(pick);
            }
        }
        let Some(buf) = self.scratch.logits else {
            return Err(GpuError::Bounds("no logits buffer".into()));
        };
        // Straight into the engine's f32 rows (device and host are little-endian): a
        // decode batch of 32 over a 128k vocabulary is 16 MB a step, and a second host
        // pass over it would cost about as much as the copy itself.
        let mut i = 0;
        while i < rows {
            if greedy[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < rows && !greedy[i] {
                i += 1;
            }
            let host = bytemuck::cast_slice_mut(&mut self.logits[start * vocab..i * vocab]);
            self.gpu.download(buf.at(start * vocab * 4), host)?;
        }
        Ok(())
    }
}

impl<G: Gpu> Backend for CudaBackend<G> {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Duration, BackendError> {
        crate::model::forward::check_batch(&self.cfg, batch)?;
        Ok(self.step(batch)?)
    }

    fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        let v = self.cfg.vocab_size;
        assert!(i < self.logit_rows, "logit row {i} of {}", self.logit_rows);
        &mut self.logits[i * v..(i + 1) * v]
    }

    /// The host threads are a pool of its cores (up to 16), made at first use: the
    /// Grace CPU (or any host) is otherwise idle between the GPU's steps.
    fn logit_rows_mut(&mut self, rows: usize) -> (&mut [f32], &dyn HostThreads) {
        let n = rows.min(self.logit_rows) * self.cfg.vocab_size;
        let pool = self.host_pool.get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            ThreadPool::new(cores.min(16))
        });
        (&mut self.logits[..n], pool)
    }

    fn greedy_pick(&mut self, i: usize) -> Option<u32> {
        self.picks.get(i).copied().flatten()
    }

    fn blocks(&self) -> &BlockPool {
        &self.pool
    }

    fn blocks_mut(&mut self) -> &mut BlockPool {
        &mut self.pool
    }

    fn report(&self) -> Arc<dyn DeviceReport> {
        self.report.clone()
    }

    fn threads(&self) -> usize {
        1
    }
}

/// `Status`'s device line: the device's own (name, free memory) and what the model
/// holds of it, e.g. `NVIDIA GB10 (sm_121) · 100.2 of 119.6 GiB free · weights 4.58 GiB,
/// KV cache 2.00 GiB (f16)`.
struct ModelOnDevice {
    device: Arc<dyn DeviceReport>,
    weights_bytes: u64,
    kv_bytes: u64,
    kv_type: KvType,
}

impl DeviceReport for ModelOnDevice {
    fn backend(&self) -> &'static str {
        self.device.backend()
    }

    fn device(&self) -> String {
        const GIB: f64 = (1u64 << 30) as f64;
        format!(
            "{} · weights {:.2} GiB, KV cache {:.2} GiB ({})",
            self.device.device(),
            self.weights_bytes as f64 / GIB,
            self.kv_bytes as f64 / GIB,
            match self.kv_type {
                KvType::F32 => "f32",
                KvType::F16 => "f16",
            }
        )
    }
}

/// Token ids as the embedding kernel reads them.
pub(super) fn token_bytes(batch: &[SeqInput<'_>]) -> Vec<u8> {
    let tokens: Vec<u32> = batch
        .iter()
        .flat_map(|s| s.tokens.iter().copied())
        .collect();
    u32_bytes(&tokens)
}
