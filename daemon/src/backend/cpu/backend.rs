//! [`CpuBackend`]: the CPU forward pass ([`Model::forward`]) with its KV cache and
//! workspace behind the [`Backend`] interface. A thin wrapper: the logits the engine
//! samples are the workspace's own buffer, never copied.

use std::sync::Arc;
use std::time::Duration;

use crate::backend::cpu::MatmulMode;
use crate::backend::{Backend, BackendError, DeviceReport, HostThreads};
use crate::model::{BlockPool, KvCache, Model, SeqInput, Workspace};

pub struct CpuBackend {
    model: Arc<Model>,
    kv: KvCache,
    ws: Workspace,
    report: Arc<CpuReport>,
}

impl CpuBackend {
    /// A KV cache of at least `kv_tokens` positions and a pool of `threads` threads.
    pub fn new(model: Arc<Model>, kv_tokens: usize, threads: usize) -> Self {
        Self::with_matmul_mode(model, kv_tokens, threads, MatmulMode::Serving)
    }

    /// The reference other backends are checked against: [`CpuBackend::new`] with the
    /// matrix products in [`MatmulMode::Reference`] (f32 activations, f64 sums) instead
    /// of on 8-bit activations. Everything else in its forward is f32 already.
    pub fn reference(model: Arc<Model>, kv_tokens: usize, threads: usize) -> Self {
        Self::with_matmul_mode(model, kv_tokens, threads, MatmulMode::Reference)
    }

    fn with_matmul_mode(
        model: Arc<Model>,
        kv_tokens: usize,
        threads: usize,
        mode: MatmulMode,
    ) -> Self {
        let kv = model.new_kv_cache(kv_tokens);
        let ws = Workspace::with_matmul_mode(threads, mode);
        let report = Arc::new(CpuReport {
            device: describe_cpu(ws.threads()),
        });
        CpuBackend {
            model,
            kv,
            ws,
            report,
        }
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    pub fn workspace(&self) -> &Workspace {
        &self.ws
    }
}

impl Backend for CpuBackend {
    fn forward(&mut self, batch: &[SeqInput<'_>]) -> Result<Duration, BackendError> {
        Ok(self.model.forward(batch, &mut self.kv, &mut self.ws)?)
    }

    fn logits_mut(&mut self, i: usize) -> &mut [f32] {
        self.ws.logits_mut(i, self.model.config.vocab_size)
    }

    fn logit_rows_mut(&mut self, rows: usize) -> (&mut [f32], &dyn HostThreads) {
        let (rows, pool) = self.ws.logit_rows_mut(rows, self.model.config.vocab_size);
        (rows, pool)
    }

    fn blocks(&self) -> &BlockPool {
        self.kv.pool()
    }

    fn blocks_mut(&mut self) -> &mut BlockPool {
        self.kv.pool_mut()
    }

    fn report(&self) -> Arc<dyn DeviceReport> {
        self.report.clone()
    }

    fn threads(&self) -> usize {
        self.ws.threads()
    }
}

struct CpuReport {
    device: String,
}

impl DeviceReport for CpuReport {
    fn backend(&self) -> &'static str {
        "cpu"
    }

    fn device(&self) -> String {
        self.device.clone()
    }
}

/// E.g. `AMD EPYC · 2 threads · avx2 kernels`.
fn describe_cpu(threads: usize) -> String {
    let mut sys = sysinfo::System::new();
    sys.refresh_cpu_list(sysinfo::CpuRefreshKind::nothing());
    let brand = sys
        .cpus()
        .first()
        .map(|c| c.brand().trim().to_string())
        .filter(|b| !b.is_empty());
    format!(
        "{} · {threads} threads · {} kernels",
        brand.unwrap_or_else(|| std::env::consts::ARCH.to_string()),
        super::kernel_name()
    )
}
