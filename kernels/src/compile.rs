//! Compiling the modules for an architecture, through the kernel cache.
//!
//! Each module is compiled to SASS for the device's own `sm_NN` (a cubin), not to PTX
//! for the driver to JIT. So nothing is JIT-compiled at start (the driver's JIT cache is
//! often unusable for a system service), and NVRTC may be newer than the driver within
//! one CUDA major version: CUDA's minor-version compatibility covers SASS, while PTX
//! from a newer NVRTC does not load.

use std::path::PathBuf;

use crate::cache::KernelCache;
use crate::cubin;
use crate::nvrtc::{self, NvrtcVersion};
use crate::sources::{self, SOURCES};
use crate::{Arch, KernelError};

/// Extra include directories for NVRTC, `:`-separated (the sources need none; this is
/// for experiments with CUDA headers).
pub const INCLUDE_ENV: &str = "SPARKD_CUDA_INCLUDE";

/// One module compiled to SASS for one architecture: the cubin the driver loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelImage {
    module: &'static str,
    arch: Arch,
    cubin: Vec<u8>,
    entries: Vec<String>,
}

impl KernelImage {
    /// Checks that `cubin` is a cubin for `arch` and reads its kernels' names.
    pub fn new(module: &'static str, arch: Arch, cubin: Vec<u8>) -> Result<Self, KernelError> {
        let bad = |reason: String| KernelError::BadImage {
            module: module.to_string(),
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
            module,
            arch,
            cubin,
            entries: info.entries,
        })
    }

    /// The module's file name, e.g. `"matvec.cu"`.
    pub fn module(&self) -> &'static str {
        self.module
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

/// Every module compiled for one architecture.
#[derive(Debug, Clone)]
pub struct KernelSet {
    pub arch: Arch,
    pub nvrtc: NvrtcVersion,
    pub modules: Vec<KernelImage>,
}

impl KernelSet {
    pub fn get(&self, module: &str) -> Option<&KernelImage> {
        self.modules.iter().find(|p| p.module == module)
    }

    /// The module that defines kernel `entry`.
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

    /// Compiles one module (by file name, e.g. `"matvec.cu"`), or takes it from the cache.
    pub fn compile_module(&self, module: &str, arch: Arch) -> Result<Compiled, KernelError> {
        let name = SOURCES
            .iter()
            .map(|(n, _)| *n)
            .find(|n| *n == module)
            .ok_or_else(|| KernelError::UnknownModule(module.to_string()))?;
        let version = nvrtc::load()?;
        let source = sources::expand(name)?;
        let options = self.options(arch);
        let key = KernelCache::key(&source, arch, &options, version);
        if let Some(cache) = &self.cache {
            if let Some(bytes) = cache.load(name, arch, &key) {
                // A file that is not a whole cubin for this arch is recompiled over.
                match KernelImage::new(name, arch, bytes) {
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
        let out = nvrtc::compile(name, &arch.to_string(), &source, &options)?;
        let image = KernelImage::new(name, arch, out.cubin)?;
        if let Some(cache) = &self.cache {
            // A read-only or full disk costs a recompile next time, nothing more.
            if let Err(e) = cache.store(name, arch, &key, image.cubin()) {
                tracing::warn!(dir = %cache.dir().display(), error = %e, "cannot cache kernels");
            }
        }
        if !out.log.is_empty() {
            tracing::warn!(module = name, %arch, log = %out.log, "NVRTC diagnostics");
        }
        Ok(Compiled {
            image,
            ptx: Some(out.ptx),
            log: out.log,
            from_cache: false,
        })
    }

    /// Compiles `module` past the cache with ptxas's resource report (registers, shared
    /// memory, stack frames and spills per kernel) in the log, after any diagnostics.
    /// For tests and tuning.
    pub fn compile_reporting_resources(
        &self,
        module: &str,
        arch: Arch,
    ) -> Result<Compiled, KernelError> {
        let name = SOURCES
            .iter()
            .map(|(n, _)| *n)
            .find(|n| *n == module)
            .ok_or_else(|| KernelError::UnknownModule(module.to_string()))?;
        let source = sources::expand(name)?;
        let mut options = self.options(arch);
        options.push("--ptxas-options=-v".to_string());
        let out = nvrtc::compile(name, &arch.to_string(), &source, &options)?;
        Ok(Compiled {
            image: KernelImage::new(name, arch, out.cubin)?,
            ptx: Some(out.ptx),
            log: out.log,
            from_cache: false,
        })
    }

    /// Every module for `arch`.
    pub fn compile_all(&self, arch: Arch) -> Result<KernelSet, KernelError> {
        let nvrtc = nvrtc::load()?;
        // One thread per module: a cold start (a new machine, a new NVRTC) compiles
        // them all, the mat-vec's 88 kernels the longest, and NVRTC programs are
        // independent. The cache writes each module through its own temporary file.
        let compiled: Vec<Result<Compiled, KernelError>> = std::thread::scope(|s| {
            let workers: Vec<_> = SOURCES
                .iter()
                .map(|(name, _)| s.spawn(move || self.compile_module(name, arch)))
                .collect();
            workers
                .into_iter()
                .map(|w| {
                    w.join().unwrap_or_else(|_| {
                        Err(KernelError::Nvrtc {
                            call: "a compile thread",
                            code: "panicked".into(),
                        })
                    })
                })
                .collect()
        });
        let modules = compiled
            .into_iter()
            .map(|c| c.map(|c| c.image))
            .collect::<Result<_, _>>()?;
        Ok(KernelSet {
            arch,
            nvrtc,
            modules,
        })
    }
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
            let image = KernelImage::new("two.cu", arch, out.cubin.clone()).unwrap();
            let mut names: Vec<&str> = image.entry_points().collect();
            names.sort();
            assert_eq!(names, ["first", "second"], "{arch}");
            // Not for another architecture, and not when cut short.
            let other: Arch = if arch.sm() == 90 { "sm_121" } else { "sm_90" }
                .parse()
                .unwrap();
            let err = KernelImage::new("two.cu", other, out.cubin.clone()).unwrap_err();
            assert!(
                err.to_string().contains(&format!("SASS for {arch}")),
                "{err}"
            );
            let cut = out.cubin[..out.cubin.len() / 2].to_vec();
            assert!(KernelImage::new("two.cu", arch, cut).is_err());
        }
    }
}
