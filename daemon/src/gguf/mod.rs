//! GGUF: reading (memory-mapped, hardened against crafted files) and writing.
