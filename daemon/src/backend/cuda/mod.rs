//! The CUDA backend. So far: choosing the compute device at start-up without ever
//! panicking on a machine that has no CUDA stack (see [`device::probe`]). The kernels
//! themselves live in the `sparkd-kernels` crate.

pub mod device;
mod driver;

pub use device::{probe, CudaVersion, DeviceChoice, DeviceError, DeviceRequest, GpuInfo};
