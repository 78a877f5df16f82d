//! Compiling the modules for an architecture, through the PTX cache.

use std::path::PathBuf;

use crate::cache::PtxCache;
use crate::nvrtc::{self, NvrtcVersion};
use crate::sources::{self, SOURCES};
use crate::{Arch, KernelError};

/// Extra include directories for NVRTC, `:`-separated (the sources need none; this is
/// for experiments with CUDA headers).
pub const INCLUDE_ENV: &str = "SPARKD_CUDA_INCLUDE";

/// PTX of one module for one architecture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ptx {
    module: &'static str,
    arch: Arch,
    text: String,
}

impl Ptx {
    /// The module's file name, e.g. `"matvec.cu"`.
    pub fn module(&self) -> &'static str {
        self.module
    }

    pub fn arch(&self) -> Arch {
        self.arch
    }

    pub fn text(&self) -> &str {
        &self.text
    }

    /// The kernels this PTX defines (`.entry` names), in order.
    pub fn entry_points(&self) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|l| {
                let l = l.trim_start();
                let rest = l
                    .strip_prefix(".visible .entry ")
                    .or_else(|| l.strip_prefix(".entry "))?;
                rest.split(|c: char| c == '(' || c.is_whitespace()).next()
            })
            .collect()
    }

    /// For cudarc's module loader.
    pub fn to_cudarc(&self) -> cudarc::nvrtc::Ptx {
        cudarc::nvrtc::Ptx::from_src(self.text.clone())
    }
}

/// The result of compiling one module.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub ptx: Ptx,
    /// NVRTC's diagnostics (warnings); empty when the source compiled cleanly or the PTX
    /// came from the cache.
    pub log: String,
    pub from_cache: bool,
}

/// Every module compiled for one architecture.
#[derive(Debug, Clone)]
pub struct PtxSet {
    pub arch: Arch,
    pub nvrtc: NvrtcVersion,
    pub modules: Vec<Ptx>,
}

impl PtxSet {
    pub fn get(&self, module: &str) -> Option<&Ptx> {
        self.modules.iter().find(|p| p.module == module)
    }

    /// The module that defines kernel `entry`.
    pub fn module_of(&self, entry: &str) -> Option<&Ptx> {
        self.modules
            .iter()
            .find(|p| p.entry_points().contains(&entry))
    }
}

/// NVRTC settings plus the cache.
#[derive(Debug, Clone)]
pub struct Compiler {
    include_dirs: Vec<PathBuf>,
    cache: Option<PtxCache>,
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
            cache: PtxCache::default_dir().map(PtxCache::new),
        }
    }

    /// Always compiles (for tests that must see NVRTC's log).
    pub fn without_cache(mut self) -> Self {
        self.cache = None;
        self
    }

    pub fn with_cache(mut self, cache: PtxCache) -> Self {
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
        let key = PtxCache::key(&source, arch, &options, version);
        if let Some(text) = self.cache.as_ref().and_then(|c| c.load(name, arch, &key)) {
            return Ok(Compiled {
                ptx: Ptx {
                    module: name,
                    arch,
                    text,
                },
                log: String::new(),
                from_cache: true,
            });
        }
        let out = nvrtc::compile(name, &arch.to_string(), &source, &options)?;
        if let Some(cache) = &self.cache {
            // A read-only or full disk costs a recompile next time, nothing more.
            if let Err(e) = cache.store(name, arch, &key, &out.ptx) {
                tracing::warn!(dir = %cache.dir().display(), error = %e, "cannot cache PTX");
            }
        }
        if !out.log.is_empty() {
            tracing::warn!(module = name, %arch, log = %out.log, "NVRTC diagnostics");
        }
        Ok(Compiled {
            ptx: Ptx {
                module: name,
                arch,
                text: out.ptx,
            },
            log: out.log,
            from_cache: false,
        })
    }

    /// ptxas's resource report for `module` (registers, shared memory, stack frames and
    /// spills per kernel): compiles to SASS for the real `sm_NN` with `-v`. A diagnostic
    /// for tests and tuning; the runtime path loads PTX.
    pub fn ptxas_report(&self, module: &str, arch: Arch) -> Result<String, KernelError> {
        let name = SOURCES
            .iter()
            .map(|(n, _)| *n)
            .find(|n| *n == module)
            .ok_or_else(|| KernelError::UnknownModule(module.to_string()))?;
        let source = sources::expand(name)?;
        let mut options = self.options(arch);
        options[0] = format!("--gpu-architecture={arch}");
        options.push("--ptxas-options=-v".to_string());
        Ok(nvrtc::compile(name, &arch.to_string(), &source, &options)?.log)
    }

    /// Every module for `arch`.
    pub fn compile_all(&self, arch: Arch) -> Result<PtxSet, KernelError> {
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
            .map(|c| c.map(|c| c.ptx))
            .collect::<Result<_, _>>()?;
        Ok(PtxSet {
            arch,
            nvrtc,
            modules,
        })
    }
}

/// Every module compiled for `arch` (e.g. `"sm_121"`), through the default cache.
pub fn compile(arch: &str) -> Result<PtxSet, KernelError> {
    Compiler::new().compile_all(arch.parse()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_points_are_read_from_ptx() {
        let ptx = Ptx {
            module: "m.cu",
            arch: "sm_90".parse().unwrap(),
            text: "\t// .globl\tfoo\n.visible .entry foo(\n\t.param .u64 a\n)\n{\n}\n\
                   .visible .entry bar_b8()\n{\n}\n.func helper()\n"
                .into(),
        };
        assert_eq!(ptx.entry_points(), vec!["foo", "bar_b8"]);
    }

    #[test]
    fn options_name_the_virtual_architecture_and_include_dirs() {
        let c = Compiler {
            include_dirs: vec![PathBuf::from("/opt/cuda/include")],
            cache: None,
        };
        let o = c.options("sm_121".parse().unwrap());
        assert!(o.contains(&"--gpu-architecture=compute_121".to_string()));
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
}
