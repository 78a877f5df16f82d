//! sparkd's CUDA kernels: the `.cu` sources (embedded at build time) and their
//! compilation at run time with NVRTC to SASS for the device's architecture (cubins),
//! cached on disk.
//!
//! Nothing here needs CUDA to build: NVRTC is loaded dynamically on first use, and its
//! absence is an ordinary [`KernelError`], so a machine without a GPU stack runs the CPU
//! backend. The sources include no CUDA header, so no include path is needed either.

mod arch;
mod cache;
mod compile;
pub mod consts;
mod cubin;
pub mod emu;
mod error;
pub mod names;
mod nvrtc;
mod sources;

pub use arch::{Arch, MIN_SM};
pub use cache::{KernelCache, CACHE_ENV};
pub use compile::{compile, units, Compiled, Compiler, KernelImage, KernelSet, Unit, INCLUDE_ENV};
pub use error::KernelError;
pub use nvrtc::{load as load_nvrtc, NvrtcVersion, NVRTC_LIB_ENV};
pub use sources::{expand, source, HEADERS, SOURCES};

/// A name part no other thread or process uses at the same time (temporary files of the
/// kernel cache and the emulator's builds, the emulator's job folders).
fn unique_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
