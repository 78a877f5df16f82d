//! The CUDA backend: choosing the compute device at start-up without ever panicking on
//! a machine that has no CUDA stack ([`device::probe`]), and the forward pass on the
//! GPU ([`CudaBackend`]), written once against a small device interface ([`Gpu`]) with
//! two implementations: the CUDA driver ([`CudaGpu`]) and the kernel emulator
//! ([`EmuGpu`]), which lets tests run the whole forward without a GPU. The kernels
//! themselves live in the `sparkd-kernels` crate.

mod backend;
pub mod device;
mod driver;
pub mod emu;
mod forward;
pub mod gpu;
mod graphs;
mod host_rows;
mod ops;
pub mod real;
mod weights;

pub use backend::{CudaBackend, CudaOptions, KernelProfile};
pub use device::{probe, CudaVersion, DeviceChoice, DeviceError, DeviceRequest, GpuInfo};
pub use emu::EmuGpu;
pub use gpu::{Gpu, GpuError};
pub use real::CudaGpu;

#[cfg(test)]
mod tests;
