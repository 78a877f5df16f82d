//! Choosing the compute device: `--device auto|cpu|cuda[:N]`.
//!
//! `auto` takes the first GPU the kernels support when the whole CUDA stack is usable
//! (driver library, a device, NVRTC, a driver of NVRTC's CUDA major version or newer) and otherwise
//! falls back to the CPU, logging why. `cuda[:N]` insists: anything missing is an error
//! that names it. Nothing here panics on a machine without CUDA.

use std::fmt;
use std::str::FromStr;

use sparkd_kernels::{Arch, KernelError, NvrtcVersion};

use super::driver::{CudaStack, DriverProblem, SystemDriver};

/// What the user asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceRequest {
    #[default]
    Auto,
    Cpu,
    /// A GPU by ordinal (`cuda` alone means 0).
    Cuda(usize),
}

impl FromStr for DeviceRequest {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, DeviceError> {
        let bad = || DeviceError::BadRequest(s.to_string());
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            _ => {
                let n = s.strip_prefix("cuda:").ok_or_else(bad)?;
                if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(bad());
                }
                n.parse().map(Self::Cuda).map_err(|_| bad())
            }
        }
    }
}

/// From the config file, spelled as on the command line (`device = "cuda:1"`).
impl<'de> serde::Deserialize<'de> for DeviceRequest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The oldest driver sparkd runs on: the driver API it binds (through cudarc's CUDA 13
/// bindings) includes calls that came with 12.8, such as `cuEventElapsedTime_v2`; an
/// older driver lacks them, and the first timed step would fail on a missing symbol.
pub const MIN_DRIVER: CudaVersion = CudaVersion {
    major: 12,
    minor: 8,
};

/// A CUDA version as the driver reports it (13000 = 13.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub fn from_driver_int(v: i32) -> Self {
        let v = v.max(0) as u32;
        CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        }
    }
}

impl fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// Compute capability, e.g. (12, 1) for GB10, (9, 0) for H100/H200.
    pub capability: (u32, u32),
    pub memory_bytes: u64,
}

impl GpuInfo {
    /// The architecture to compile the kernels for; an error when they do not support it.
    pub fn arch(&self) -> Result<Arch, KernelError> {
        Arch::from_capability(self.capability.0, self.capability.1)
    }
}

/// The probe's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceChoice {
    /// Run on the CPU; `reason` says why (asked for, or what CUDA lacked under `auto`).
    Cpu { reason: String },
    Cuda {
        gpu: GpuInfo,
        arch: Arch,
        driver: CudaVersion,
        nvrtc: NvrtcVersion,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("invalid device `{0}`: expected auto, cpu, cuda or cuda:N")]
    BadRequest(String),
    #[error("no NVIDIA driver: libcuda.so.1 cannot be loaded (install the driver, or check LD_LIBRARY_PATH)")]
    NoDriver,
    #[error("the CUDA driver does not work: {call} failed with {error}")]
    Driver { call: &'static str, error: String },
    #[error("no GPU {ordinal}: the driver sees {count}")]
    NoSuchGpu { ordinal: usize, count: usize },
    #[error("GPU {ordinal} ({name}, compute capability {major}.{minor}) is not supported: sparkd's kernels need sm_80 or newer")]
    Unsupported {
        ordinal: usize,
        name: String,
        major: u32,
        minor: u32,
    },
    #[error("cannot compile the CUDA kernels: {0}")]
    Nvrtc(#[from] KernelError),
    #[error("the driver supports CUDA {driver}; sparkd needs a driver of CUDA {MIN_DRIVER} or newer (update the NVIDIA driver)")]
    DriverBelowMinimum { driver: CudaVersion },
    #[error("the driver supports CUDA {driver} but NVRTC is {nvrtc}; kernels from a newer CUDA major version do not load (update the driver, or use an NVRTC of CUDA {} or older)", driver.major)]
    DriverTooOld {
        driver: CudaVersion,
        nvrtc: NvrtcVersion,
    },
}

impl From<DriverProblem> for DeviceError {
    fn from(p: DriverProblem) -> Self {
        match p {
            DriverProblem::NotInstalled => DeviceError::NoDriver,
            DriverProblem::Call { call, error } => DeviceError::Driver { call, error },
        }
    }
}

/// Decides where the model runs, logging the decision and, under `auto`, why the CPU.
pub fn probe(request: DeviceRequest) -> Result<DeviceChoice, DeviceError> {
    probe_with(request, &SystemDriver)
}

pub(crate) fn probe_with(
    request: DeviceRequest,
    stack: &dyn CudaStack,
) -> Result<DeviceChoice, DeviceError> {
    let choice = match request {
        DeviceRequest::Cpu => DeviceChoice::Cpu {
            reason: "--device cpu".to_string(),
        },
        DeviceRequest::Cuda(n) => find_gpu(stack, Some(n))?,
        DeviceRequest::Auto => find_gpu(stack, None).unwrap_or_else(|e| DeviceChoice::Cpu {
            reason: e.to_string(),
        }),
    };
    match &choice {
        DeviceChoice::Cpu { reason } => {
            tracing::info!(%request, %reason, "compute device: CPU");
        }
        DeviceChoice::Cuda {
            gpu,
            arch,
            driver,
            nvrtc,
        } => tracing::info!(
            %request,
            gpu = gpu.ordinal,
            name = %gpu.name,
            %arch,
            memory_gib = gpu.memory_bytes as f64 / (1u64 << 30) as f64,
            %driver,
            %nvrtc,
            "compute device: CUDA"
        ),
    }
    Ok(choice)
}

/// GPU `ordinal`, or with `None` the first supported one.
fn find_gpu(stack: &dyn CudaStack, ordinal: Option<usize>) -> Result<DeviceChoice, DeviceError> {
    let driver = stack.driver()?;
    if driver < MIN_DRIVER {
        return Err(DeviceError::DriverBelowMinimum { driver });
    }
    let gpus = stack.devices()?;
    let (gpu, arch) = match ordinal {
        Some(n) => {
            let gpu = gpus.get(n).ok_or(DeviceError::NoSuchGpu {
                ordinal: n,
                count: gpus.len(),
            })?;
            (gpu, gpu.arch().map_err(|_| unsupported(gpu))?)
        }
        None => {
            let mut first_err = None;
            let mut found = None;
            for gpu in &gpus {
                match gpu.arch() {
                    Ok(arch) => {
                        found = Some((gpu, arch));
                        break;
                    }
                    Err(_) => {
                        tracing::info!(gpu = gpu.ordinal, name = %gpu.name, "GPU too old for sparkd's kernels; skipped");
                        first_err.get_or_insert_with(|| unsupported(gpu));
                    }
                }
            }
            found.ok_or_else(|| {
                first_err.unwrap_or(DeviceError::NoSuchGpu {
                    ordinal: 0,
                    count: 0,
                })
            })?
        }
    };
    let nvrtc = stack.nvrtc()?;
    // The kernels are SASS (cubins), which CUDA's minor-version compatibility lets a
    // driver of the same major version load whatever NVRTC's minor version (PTX would
    // need a driver at least as new as NVRTC).
    if driver.major < nvrtc.major {
        return Err(DeviceError::DriverTooOld { driver, nvrtc });
    }
    Ok(DeviceChoice::Cuda {
        gpu: gpu.clone(),
        arch,
        driver,
        nvrtc,
    })
}

fn unsupported(gpu: &GpuInfo) -> DeviceError {
    DeviceError::Unsupported {
        ordinal: gpu.ordinal,
        name: gpu.name.clone(),
        major: gpu.capability.0,
        minor: gpu.capability.1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scripted CUDA stack.
    struct Fake {
        driver: Result<CudaVersion, DriverProblem>,
        gpus: Vec<GpuInfo>,
        nvrtc: Option<NvrtcVersion>,
    }

    impl CudaStack for Fake {
        fn driver(&self) -> Result<CudaVersion, DriverProblem> {
            self.driver.clone()
        }
        fn devices(&self) -> Result<Vec<GpuInfo>, DriverProblem> {
            Ok(self.gpus.clone())
        }
        fn nvrtc(&self) -> Result<NvrtcVersion, KernelError> {
            self.nvrtc.ok_or(KernelError::NvrtcNotFound {
                candidates: vec!["libnvrtc.so.13".into()],
            })
        }
    }

    fn gpu(ordinal: usize, name: &str, capability: (u32, u32)) -> GpuInfo {
        GpuInfo {
            ordinal,
            name: name.into(),
            capability,
            memory_bytes: 128 << 30,
        }
    }

    fn working(gpus: Vec<GpuInfo>) -> Fake {
        Fake {
            driver: Ok(CudaVersion::from_driver_int(13000)),
            gpus,
            nvrtc: Some(NvrtcVersion {
                major: 13,
                minor: 0,
            }),
        }
    }

    fn cpu_reason(c: DeviceChoice) -> String {
        match c {
            DeviceChoice::Cpu { reason } => reason,
            other => panic!("expected the CPU, got {other:?}"),
        }
    }

    #[test]
    fn requests_parse_and_print_back() {
        for (s, want) in [
            ("auto", DeviceRequest::Auto),
            ("cpu", DeviceRequest::Cpu),
            ("cuda", DeviceRequest::Cuda(0)),
            ("cuda:3", DeviceRequest::Cuda(3)),
        ] {
            assert_eq!(s.parse::<DeviceRequest>().unwrap(), want);
        }
        assert_eq!(DeviceRequest::Cuda(3).to_string(), "cuda:3");
        for bad in [
            "",
            "gpu",
            "CUDA",
            "cuda:",
            "cuda:-1",
            "cuda:+1",
            "cuda:x",
            "cuda:99999999999999999999",
        ] {
            assert!(
                matches!(
                    bad.parse::<DeviceRequest>(),
                    Err(DeviceError::BadRequest(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn no_driver_means_cpu_under_auto_and_a_clear_error_under_cuda() {
        let stack = Fake {
            driver: Err(DriverProblem::NotInstalled),
            ..working(vec![])
        };
        let reason = cpu_reason(probe_with(DeviceRequest::Auto, &stack).unwrap());
        assert!(reason.contains("libcuda"), "{reason}");
        let err = probe_with(DeviceRequest::Cuda(0), &stack).unwrap_err();
        assert!(matches!(err, DeviceError::NoDriver), "{err}");
        assert!(err.to_string().contains("no NVIDIA driver"));
        assert_eq!(
            probe_with(DeviceRequest::Cpu, &stack).unwrap(),
            DeviceChoice::Cpu {
                reason: "--device cpu".into()
            }
        );
    }

    #[test]
    fn a_failing_driver_is_reported_with_the_call_and_error_name() {
        let stack = Fake {
            driver: Err(DriverProblem::Call {
                call: "cuInit",
                error: "CUDA_ERROR_NO_DEVICE".into(),
            }),
            ..working(vec![])
        };
        let reason = cpu_reason(probe_with(DeviceRequest::Auto, &stack).unwrap());
        assert!(
            reason.contains("cuInit") && reason.contains("CUDA_ERROR_NO_DEVICE"),
            "{reason}"
        );
        assert!(matches!(
            probe_with(DeviceRequest::Cuda(0), &stack),
            Err(DeviceError::Driver { call: "cuInit", .. })
        ));
    }

    #[test]
    fn auto_skips_unsupported_gpus_and_cuda_n_names_the_problem() {
        let stack = working(vec![
            gpu(0, "Tesla T4", (7, 5)),
            gpu(1, "NVIDIA GB10", (12, 1)),
        ]);
        match probe_with(DeviceRequest::Auto, &stack).unwrap() {
            DeviceChoice::Cuda { gpu, arch, .. } => {
                assert_eq!(gpu.ordinal, 1);
                assert_eq!(arch.to_string(), "sm_121");
            }
            other => panic!("{other:?}"),
        }
        let err = probe_with(DeviceRequest::Cuda(0), &stack).unwrap_err();
        assert!(
            matches!(
                err,
                DeviceError::Unsupported {
                    ordinal: 0,
                    major: 7,
                    minor: 5,
                    ..
                }
            ),
            "{err}"
        );
        let err = probe_with(DeviceRequest::Cuda(2), &stack).unwrap_err();
        assert!(
            matches!(
                err,
                DeviceError::NoSuchGpu {
                    ordinal: 2,
                    count: 2
                }
            ),
            "{err}"
        );

        let old_only = working(vec![gpu(0, "Tesla T4", (7, 5))]);
        let reason = cpu_reason(probe_with(DeviceRequest::Auto, &old_only).unwrap());
        assert!(reason.contains("Tesla T4"), "{reason}");
        let none = working(vec![]);
        let reason = cpu_reason(probe_with(DeviceRequest::Auto, &none).unwrap());
        assert!(reason.contains("sees 0"), "{reason}");
    }

    #[test]
    fn nvrtc_missing_or_of_a_newer_cuda_than_the_driver_falls_back_under_auto() {
        let no_nvrtc = Fake {
            nvrtc: None,
            ..working(vec![gpu(0, "NVIDIA H200", (9, 0))])
        };
        let reason = cpu_reason(probe_with(DeviceRequest::Auto, &no_nvrtc).unwrap());
        assert!(reason.contains("NVRTC"), "{reason}");
        assert!(matches!(
            probe_with(DeviceRequest::Cuda(0), &no_nvrtc),
            Err(DeviceError::Nvrtc(_))
        ));

        let old_driver = Fake {
            driver: Ok(CudaVersion::from_driver_int(12080)),
            ..working(vec![gpu(0, "NVIDIA H200", (9, 0))])
        };
        let err = probe_with(DeviceRequest::Cuda(0), &old_driver).unwrap_err();
        assert!(
            err.to_string().contains("CUDA 12.8 but NVRTC is 13.0"),
            "{err}"
        );
        cpu_reason(probe_with(DeviceRequest::Auto, &old_driver).unwrap());

        // A driver older than the driver API sparkd binds: a clear refusal, not a
        // missing symbol at the first step.
        let ancient = Fake {
            driver: Ok(CudaVersion::from_driver_int(12040)),
            nvrtc: Some(NvrtcVersion {
                major: 12,
                minor: 4,
            }),
            ..working(vec![gpu(0, "NVIDIA H100", (9, 0))])
        };
        let err = probe_with(DeviceRequest::Cuda(0), &ancient).unwrap_err();
        assert!(
            err.to_string()
                .contains("CUDA 12.4; sparkd needs a driver of CUDA 12.8 or newer"),
            "{err}"
        );
        cpu_reason(probe_with(DeviceRequest::Auto, &ancient).unwrap());

        // A newer NVRTC of the driver's major version is fine: the kernels are SASS.
        let newer_minor = Fake {
            nvrtc: Some(NvrtcVersion {
                major: 13,
                minor: 1,
            }),
            ..working(vec![gpu(0, "NVIDIA GB10", (12, 1))])
        };
        match probe_with(DeviceRequest::Auto, &newer_minor).unwrap() {
            DeviceChoice::Cuda { nvrtc, arch, .. } => {
                assert_eq!(
                    (nvrtc.to_string(), arch.to_string()),
                    ("13.1".into(), "sm_121".into())
                )
            }
            other => panic!("{other:?}"),
        }

        match probe_with(
            DeviceRequest::Cuda(0),
            &working(vec![gpu(0, "NVIDIA H200", (9, 0))]),
        )
        .unwrap()
        {
            DeviceChoice::Cuda { arch, driver, .. } => {
                assert_eq!(arch.to_string(), "sm_90");
                assert_eq!(driver.to_string(), "13.0");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_real_probe_never_panics_and_matches_the_driver_library() {
        // SAFETY: a dlopen probe of the system driver library, as `probe` itself does.
        let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
        let auto = probe(DeviceRequest::Auto).unwrap();
        let cuda = probe(DeviceRequest::Cuda(0));
        if !driver_present {
            assert!(cpu_reason(auto).contains("libcuda"));
            assert!(matches!(cuda, Err(DeviceError::NoDriver)));
        } else {
            eprintln!("driver present: auto chose {auto:?}, cuda:0 gave {cuda:?}");
        }
    }
}
