//! Compute backends. The CPU backend runs everywhere; CUDA comes later behind the same
//! interface.

pub mod cpu;
