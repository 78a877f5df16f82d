//! The CUDA driver calls the device probe makes, behind a trait so the probe's decisions
//! are testable without a GPU. [`SystemDriver`] holds every `unsafe` call: cudarc loads
//! `libcuda` lazily and panics when it is absent, so presence is checked first.

use std::ffi::{c_char, c_int};

use cudarc::driver::{result, sys};
use sparkd_kernels::{KernelError, NvrtcVersion};

use super::device::{CudaVersion, GpuInfo};

/// Why the driver cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DriverProblem {
    /// No loadable libcuda: no NVIDIA driver on this machine (or not on the loader path).
    NotInstalled,
    /// The library loaded but a call failed (e.g. CUDA_ERROR_NO_DEVICE).
    Call { call: &'static str, error: String },
}

/// What the probe needs from the CUDA stack.
pub(crate) trait CudaStack {
    /// Loads and initialises the driver; returns the CUDA version it supports.
    fn driver(&self) -> Result<CudaVersion, DriverProblem>;
    /// The visible GPUs, in ordinal order. Only called after `driver` succeeded.
    fn devices(&self) -> Result<Vec<GpuInfo>, DriverProblem>;
    /// Loads NVRTC, which compiles the kernels.
    fn nvrtc(&self) -> Result<NvrtcVersion, KernelError>;
}

/// The real CUDA stack of this machine.
pub(crate) struct SystemDriver;

fn call_error(call: &'static str) -> impl Fn(result::DriverError) -> DriverProblem {
    move |e| DriverProblem::Call {
        call,
        error: e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0)),
    }
}

impl CudaStack for SystemDriver {
    fn driver(&self) -> Result<CudaVersion, DriverProblem> {
        // SAFETY: dlopen of the system's libcuda, which is what we are probing for.
        if !unsafe { sys::is_culib_present() } {
            return Err(DriverProblem::NotInstalled);
        }
        result::init().map_err(call_error("cuInit"))?;
        let mut v: c_int = 0;
        // SAFETY: the library is present and initialised; `v` is a valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .map_err(call_error("cuDriverGetVersion"))?;
        Ok(CudaVersion::from_driver_int(v))
    }

    fn devices(&self) -> Result<Vec<GpuInfo>, DriverProblem> {
        let count = result::device::get_count().map_err(call_error("cuDeviceGetCount"))?;
        (0..count.max(0))
            .map(|ordinal| {
                let dev = result::device::get(ordinal).map_err(call_error("cuDeviceGet"))?;
                let attr = |a| {
                    // SAFETY: `dev` came from cuDeviceGet.
                    unsafe { result::device::get_attribute(dev, a) }
                        .map_err(call_error("cuDeviceGetAttribute"))
                };
                let major =
                    attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
                let minor =
                    attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
                // SAFETY: `dev` came from cuDeviceGet.
                let memory = unsafe { result::device::total_mem(dev) }
                    .map_err(call_error("cuDeviceTotalMem"))?;
                Ok(GpuInfo {
                    ordinal: ordinal as usize,
                    name: device_name(dev)?,
                    capability: (major.max(0) as u32, minor.max(0) as u32),
                    memory_bytes: memory as u64,
                })
            })
            .collect()
    }

    fn nvrtc(&self) -> Result<NvrtcVersion, KernelError> {
        sparkd_kernels::load_nvrtc()
    }
}

/// cuDeviceGetName into a local buffer (cudarc's wrapper panics on a name without NUL).
fn device_name(dev: sys::CUdevice) -> Result<String, DriverProblem> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer is valid for its length; the driver writes at most that much.
    unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as c_int, dev) }
        .result()
        .map_err(call_error("cuDeviceGetName"))?;
    let bytes: Vec<u8> = buf
        .iter()
        // `c_char` is `i8` on x86-64 and `u8` on AArch64: the same bits either way.
        .map(|&c| c.to_ne_bytes()[0])
        .take_while(|&b| b != 0)
        .collect();
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
