//! The crate's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "NVRTC not found: none of {candidates:?} could be loaded. Install the CUDA 13 \
         toolkit, or run scripts/install-cuda-wheels.sh and set SPARKD_NVRTC_LIB (or \
         LD_LIBRARY_PATH) to the library it prints"
    )]
    NvrtcNotFound { candidates: Vec<String> },
    #[error("cannot load {path} (from {env}): {reason}")]
    NvrtcLoad {
        env: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("unsupported GPU architecture `{0}`: expected sm_NN or compute_NN with NN >= 80 (e.g. sm_90, sm_121)")]
    BadArch(String),
    #[error("unknown kernel module `{0}`")]
    UnknownModule(String),
    #[error("{module}: `#include \"{header}\"` names no embedded header")]
    UnknownHeader { module: String, header: String },
    #[error("{module}: {what} contains a NUL byte")]
    NulByte { module: String, what: &'static str },
    #[error("NVRTC {call} failed: {code}")]
    Nvrtc { call: &'static str, code: String },
    #[error("{module} for {arch}: NVRTC's output is unusable: {reason}")]
    BadImage {
        module: String,
        arch: String,
        reason: String,
    },
    #[error("{module} does not compile for {arch}:\n{log}")]
    Compile {
        module: String,
        arch: String,
        log: String,
    },
}
