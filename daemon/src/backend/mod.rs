//! Compute backends. The CPU backend runs everywhere; the CUDA backend (so far only the
//! device probe) is coming behind the same interface.

pub mod cpu;
pub mod cuda;
