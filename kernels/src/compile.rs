//! Compiling the modules for an architecture, through the kernel cache.
//!
//! Each module is compiled to SASS for the device's own `sm_NN` (a cubin), not to PTX
//! for the driver to JIT. So nothing is JIT-compiled at start (whatever the state of
//! the driver's own JIT cache), and NVRTC may be newer than the driver within one CUDA
//! major version: CUDA's minor-version compatibility covers SASS, while PTX from a newer
//! NVRTC does not load.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::cache::KernelCache;
use crate::cubin;
use crate::names::WeightType;
use crate::nvrtc::{self, NvrtcVersion};
use crate::sources::{self, SOURCES};
use crate::{Arch, KernelError};

/// Extra include directories for NVRTC, `:`-separated (the sources need none; this is
/// for experiments with CUDA headers).
pub const INCLUDE_ENV: &str = "SPARKD_CUDA_INCLUDE";

/// Modules whose kernels come one per weight format, compiled one format per NVRTC
/// program: the mat-vec alone is 88 kernels, tens of seconds in one program, which
/// would leave a cold start waiting on one core.
const SPLIT_BY_WEIGHT_TYPE: [&str; 2] = ["matvec.cu", "mmq.cu"];

/// One NVRTC program: a module, or one weight format's part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    pub module: &'static str,
    /// `Some`: only this format's kernels (`SPARKD_ONLY_WTYPE`, quant.cuh).
    pub only: Option<WeightType>,
}

impl Unit {
    pub fn whole(module: &'static str) -> Self {
        Unit { module, only: None }
    }

    /// For messages and cache file names: `matvec.cu` or `matvec.cu:q4_k`.
    pub fn label(&self) -> String {
        match self.only {
            None => self.module.to_string(),
            Some(t) => format!("{}:{}", self.module, t.suffix()),
        }
    }
}

/// What `compile_all` compiles: every module, the largest split by weight format,
/// those first (so that the longest programs start first).
pub fn units() -> Vec<Unit> {
    let split = SPLIT_BY_WEIGHT_TYPE.iter().flat_map(|m| {
        WeightType::ALL.into_iter().map(|t| Unit {
            module: m,
            only: Some(t),
        })
    });
    let whole = SOURCES
        .iter()
        .filter(|(m, _)| !SPLIT_BY_WEIGHT_TYPE.contains(m))
        .map(|(m, _)| Unit::whole(m));
    split.chain(whole).collect()
}

/// One compilation unit compiled to SASS for one architecture: the cubin the driver
/// loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelImage {
    unit: Unit,
    arch: Arch,
    cubin: Vec<u8>,
    entries: Vec<String>,
}

impl KernelImage {
    /// Checks that `cubin` is a cubin for `arch` and reads its kernels' names.
    pub fn new(unit: Unit, arch: Arch, cubin: Vec<u8>) -> Result<Self, KernelError> {
        let bad = |reason: String| KernelError::BadImage {
            module: unit.label(),
            arch: arch.to_string(),
            reason,
        };
        let info = cubin::inspect(&cubin).map_err(|e| bad(e.to_string()))?;
        if info.sm != arch.sm() {
            return Err(bad(format!("SASS for sm_{}", info.sm)));
        }
        if info.entries.is_empty() {
            return Err(bad("no kernels".into()));
        }
        Ok(KernelImage {
            unit,
            arch,
            cubin,
            entries: info.entries,
        })
    }

    /// The module's file name, e.g. `"matvec.cu"`.
    pub fn module(&self) -> &'static str {
        self.unit.module
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The ELF image, for `cuModuleLoadData`.
    pub fn cubin(&self) -> &[u8] {
        &self.cubin
    }

    /// The kernels this image defines.
    pub fn entry_points(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(String::as_str)
    }
}

/// The result of compiling one module.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub image: KernelImage,
    /// The PTX NVRTC went through, for tests that inspect the code; `None` when the
    /// image came from the cache.
    pub ptx: Option<String>,
    /// NVRTC's diagnostics (warnings); empty when the source compiled cleanly or the
    /// image came from the cache.
    pub log: String,
    pub from_cache: bool,
}

/// Every module compiled for one architecture, in [`units`] order.
#[derive(Debug, Clone)]
pub struct KernelSet {
    pub arch: Arch,
    pub nvrtc: NvrtcVersion,
    pub modules: Vec<KernelImage>,
}

impl KernelSet {
    /// The image that defines kernel `entry`.
    pub fn module_of(&self, entry: &str) -> Option<&KernelImage> {
        self.modules
            .iter()
            .find(|p| p.entry_points().any(|e| e == entry))
    }
}

/// NVRTC settings plus the cache.
#[derive(Debug, Clone)]
pub struct Compiler {
    include_dirs: Vec<PathBuf>,
    cache: Option<KernelCache>,
}

impl Default for Compiler {
    fn default() -> Self {
        Self::new()
    }
}

impl Compiler {
    /// Include directories from `SPARKD_CUDA_INCLUDE`, the default cache directory.
    pub fn new() -> Self {
        let include_dirs = std::env::var_os(INCLUDE_ENV)
            .map(|v| {
                std::env::split_paths(&v)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect()
            })
            .unwrap_or_default();
        Compiler {
            include_dirs,
            cache: KernelCache::default_dir().map(KernelCache::new),
        }
    }

    /// Always compiles (for tests that must see NVRTC's log).
    pub fn without_cache(mut self) -> Self {
        self.cache = None;
        self
    }

    pub fn with_cache(mut self, cache: KernelCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// NVRTC options for `arch`. `-default-device` is not used: every function says where
    /// it runs. Fast math stays off so results track the CPU backend.
    pub fn options(&self, arch: Arch) -> Vec<String> {
        let mut o = vec![
            format!("--gpu-architecture={}", arch.nvrtc_target()),
            "--std=c++17".to_string(),
            "--fmad=true".to_string(),
        ];
        o.extend(
            self.include_dirs
                .iter()
                .map(|d| format!("--include-path={}", d.display())),
        );
        o
    }

    /// Compiles one whole module (by file name, e.g. `"matvec.cu"`), or takes it from
    /// the cache.
    pub fn compile_module(&self, module: &str, arch: Arch) -> Result<Compiled, KernelError> {
        self.compile_unit(Unit::whole(module_name(module)?), arch)
    }

    /// The NVRTC options for `unit`.
    fn unit_options(&self, unit: Unit, arch: Arch) -> Vec<String> {
        let mut options = self.options(arch);
        if let Some(t) = unit.only {
            options.push(format!("-DSPARKD_ONLY_WTYPE={}", t.ggml_id()));
        }
        options
    }

    /// Compiles one unit, or takes it from the cache.
    pub fn compile_unit(&self, unit: Unit, arch: Arch) -> Result<Compiled, KernelError> {
        let name = module_name(unit.module)?;
        let version = nvrtc::load()?;
        let source = sources::expand(name)?;
        let options = self.unit_options(unit, arch);
        let key = KernelCache::key(&source, arch, &options, version);
        let label = unit.label();
        if let Some(cache) = &self.cache {
            if let Some(bytes) = cache.load(&label, arch, &key) {
                // A file that is not a whole cubin for this arch is recompiled over.
                match KernelImage::new(unit, arch, bytes) {
                    Ok(image) => {
                        return Ok(Compiled {
                            image,
                            ptx: None,
                            log: String::new(),
                            from_cache: true,
                        })
                    }
                    Err(e) => tracing::warn!(error = %e, "damaged cache entry; compiling again"),
                }
            }
        }
        let compiled = compile_fresh(unit, arch, &source, &options)?;
        if let Some(cache) = &self.cache {
            // A read-only or full disk costs a recompile next time, nothing more.
            if let Err(e) = cache.store(&label, arch, &key, compiled.image.cubin()) {
                tracing::warn!(dir = %cache.dir().display(), error = %e, "cannot cache kernels");
            }
        }
        if !compiled.log.is_empty() {
            tracing::warn!(module = %label, %arch, log = %compiled.log, "NVRTC diagnostics");
        }
        Ok(compiled)
    }

    /// Compiles `module` past the cache with ptxas's resource report (registers, shared
    /// memory, stack frames and spills per kernel) in the log, after any diagnostics.
    /// For tests and tuning.
    pub fn compile_reporting_resources(
        &self,
        module: &str,
        arch: Arch,
    ) -> Result<Compiled, KernelError> {
        let name = module_name(module)?;
        let source = sources::expand(name)?;
        let mut options = self.options(arch);
        options.push("--ptxas-options=-v".to_string());
        compile_fresh(Unit::whole(name), arch, &source, &options)
    }

    /// Every module for `arch`, as the [`units`].
    pub fn compile_all(&self, arch: Arch) -> Result<KernelSet, KernelError> {
        let nvrtc = nvrtc::load()?;
        // A cold start (a new machine, a new NVRTC) compiles every unit; NVRTC programs
        // are independent, so a worker per core takes them in turn, longest first. The
        // cache writes each through its own temporary file.
        let started = std::time::Instant::now();
        let units = units();
        let next = AtomicUsize::new(0);
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(units.len());
        let mut done = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(unit) = units.get(i) else { break };
                            mine.push((i, self.compile_unit(*unit, arch)));
                        }
                        mine
                    })
                })
                .collect();
            let mut all = Vec::with_capacity(units.len());
            for h in handles {
                all.extend(h.join().map_err(|_| KernelError::Nvrtc {
                    call: "a compile thread",
                    code: "panicked".into(),
                })?);
            }
            Ok::<_, KernelError>(all)
        })?;
        done.sort_by_key(|(i, _)| *i);
        let compiled = done
            .into_iter()
            .map(|(_, c)| c)
            .collect::<Result<Vec<_>, _>>()?;
        let cached = compiled.iter().filter(|c| c.from_cache).count();
        if let Some(cache) = &self.cache {
            let removed = cache.remove_legacy_ptx();
            if removed > 0 {
                tracing::info!(files = removed, "removed the PTX cache of an older sparkd");
            }
        }
        tracing::info!(
            %arch,
            units = compiled.len(),
            cached,
            workers,
            ms = started.elapsed().as_millis() as u64,
            "CUDA kernels ready"
        );
        let modules = compiled.into_iter().map(|c| c.image).collect();
        Ok(KernelSet {
            arch,
            nvrtc,
            modules,
        })
    }
}

/// `unit` (its module's expanded `source`) through NVRTC with `options`, past the cache.
fn compile_fresh(
    unit: Unit,
    arch: Arch,
    source: &str,
    options: &[String],
) -> Result<Compiled, KernelError> {
    let out = nvrtc::compile(unit.module, &arch.to_string(), source, options)?;
    Ok(Compiled {
        image: KernelImage::new(unit, arch, out.cubin)?,
        ptx: Some(out.ptx),
        log: out.log,
        from_cache: false,
    })
}

/// The `SOURCES` name equal to `module`.
fn module_name(module: &str) -> Result<&'static str, KernelError> {
    SOURCES
        .iter()
        .map(|(n, _)| *n)
        .find(|n| *n == module)
        .ok_or_else(|| KernelError::UnknownModule(module.to_string()))
}

/// Every module compiled for `arch` (e.g. `"sm_121"`), through the default cache.
pub fn compile(arch: &str) -> Result<KernelSet, KernelError> {
    Compiler::new().compile_all(arch.parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_name_the_real_architecture_and_include_dirs() {
        let c = Compiler {
            include_dirs: vec![PathBuf::from("/opt/cuda/include")],
            cache: None,
        };
        let o = c.options("sm_121".parse().unwrap());
        assert!(o.contains(&"--gpu-architecture=sm_121".to_string()));
        assert!(o.contains(&"--include-path=/opt/cuda/include".to_string()));
    }

    #[test]
    fn units_cover_every_module_once_and_split_the_largest_by_format() {
        let units = units();
        for (module, _) in SOURCES {
            let parts: Vec<&Unit> = units.iter().filter(|u| u.module == *module).collect();
            if SPLIT_BY_WEIGHT_TYPE.contains(module) {
                let formats: Vec<_> = parts.iter().map(|u| u.only.unwrap()).collect();
                assert_eq!(formats, WeightType::ALL, "{module}");
            } else {
                assert_eq!(parts, [&Unit::whole(module)]);
            }
        }
        let mut labels: Vec<String> = units.iter().map(Unit::label).collect();
        assert!(labels.contains(&"matvec.cu:q4_k".to_string()), "{labels:?}");
        labels.dedup();
        assert_eq!(labels.len(), units.len());
        let c = Compiler::new().without_cache();
        let q6k = c.unit_options(units[12], "sm_90".parse().unwrap());
        assert_eq!(units[12].only, Some(WeightType::Q6_K));
        assert_eq!(q6k.last().unwrap(), "-DSPARKD_ONLY_WTYPE=14");
    }

    #[test]
    fn unknown_modules_are_rejected_before_loading_nvrtc() {
        let err = Compiler::new()
            .without_cache()
            .compile_module("nope.cu", "sm_90".parse().unwrap())
            .unwrap_err();
        assert!(matches!(err, KernelError::UnknownModule(_)));
        assert!(matches!(compile("sm_7"), Err(KernelError::BadArch(_))));
    }

    #[test]
    fn a_compile_error_carries_the_log_with_file_and_line() {
        if let Err(e) = nvrtc::load() {
            eprintln!("skipping: NVRTC not found (run scripts/install-cuda-wheels.sh): {e}");
            return;
        }
        let arch: Arch = "sm_90".parse().unwrap();
        let src = "extern \"C\" __global__ void k(float* x) {\n x[0] = undefined_name;\n}\n";
        let err =
            nvrtc::compile("broken.cu", "sm_90", src, &Compiler::new().options(arch)).unwrap_err();
        match err {
            KernelError::Compile { log, module, .. } => {
                assert_eq!(module, "broken.cu");
                assert!(log.contains("broken.cu(2)"), "{log}");
                assert!(log.contains("undefined_name"), "{log}");
            }
            other => panic!("expected a compile error, got {other}"),
        }
    }

    #[test]
    fn warnings_reach_the_log_of_a_successful_compile() {
        if let Err(e) = nvrtc::load() {
            eprintln!("skipping: NVRTC not found (run scripts/install-cuda-wheels.sh): {e}");
            return;
        }
        let arch: Arch = "sm_90".parse().unwrap();
        // A variable set but never used is a front-end warning.
        let src =
            "extern \"C\" __global__ void k(float* x) {\n int unused = 1;\n x[0] = 1.0f;\n}\n";
        let out = nvrtc::compile("warn.cu", "sm_90", src, &Compiler::new().options(arch)).unwrap();
        eprintln!("LOG<<{}>>", out.log);
        assert!(out.log.contains("warn.cu(2)"), "{}", out.log);
        assert!(out.ptx.contains(".entry k("));
    }

    #[test]
    fn the_image_is_sass_for_the_real_architecture_and_names_every_kernel() {
        if let Err(e) = nvrtc::load() {
            eprintln!("skipping: NVRTC not found (run scripts/install-cuda-wheels.sh): {e}");
            return;
        }
        let src = "extern \"C\" __global__ void first(float* x) { x[0] = 1.0f; }\n\
                   static __device__ __noinline__ float helper(float v) { return v * v; }\n\
                   extern \"C\" __global__ void second(float* x) { x[1] = helper(x[2]); }\n";
        for arch in ["sm_90", "sm_121"] {
            let arch: Arch = arch.parse().unwrap();
            let out = nvrtc::compile("two.cu", "t", src, &Compiler::new().options(arch)).unwrap();
            let image = KernelImage::new(Unit::whole("two.cu"), arch, out.cubin.clone()).unwrap();
            let mut names: Vec<&str> = image.entry_points().collect();
            names.sort();
            assert_eq!(names, ["first", "second"], "{arch}");
            // Not for another architecture, and not when cut short.
            let other: Arch = if arch.sm() == 90 { "sm_121" } else { "sm_90" }
                .parse()
                .unwrap();
            let err =
                KernelImage::new(Unit::whole("two.cu"), other, out.cubin.clone()).unwrap_err();
            assert!(
                err.to_string().contains(&format!("SASS for {arch}")),
                "{err}"
            );
            let cut = out.cubin[..out.cubin.len() / 2].to_vec();
            assert!(KernelImage::new(Unit::whole("two.cu"), arch, cut).is_err());
        }
    }
}
