//! Llama-family models: configuration from GGUF metadata, weights located in the
//! memory-mapped file, the batched forward pass and the paged KV cache.

pub mod config;
pub mod forward;
pub mod kv;
pub mod ops;
pub mod prefix;
pub mod rope;
pub mod synth;
pub mod weights;

use std::path::{Path, PathBuf};

use crate::gguf::{GgufError, GgufFile};

pub use config::{Arch, ConfigError, ModelConfig};
pub use forward::{ForwardError, SeqInput, Workspace};
pub use kv::{BlockPool, BlockTable, KvCache, KvFull, BLOCK_TOKENS};
pub use weights::{Weights, WeightsError};

/// A model that cannot be loaded. The message names the file; the cause is the
/// error's `source()` (printed after it by `{:#}` and error reporters, not repeated).
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}", path.display())]
    Gguf { path: PathBuf, source: GgufError },
    #[error("{}", path.display())]
    Config { path: PathBuf, source: ConfigError },
    #[error("{}", path.display())]
    Weights { path: PathBuf, source: WeightsError },
}

/// A loaded model: the file's bytes, its configuration and where each weight lives.
/// Immutable after load and shared by reference; all per-sequence state is the
/// caller's (`KvCache`, `BlockTable`).
pub struct Model {
    pub file: GgufFile,
    pub config: ModelConfig,
    pub weights: Weights,
    pub path: PathBuf,
}

impl Model {
    /// Loads the model from a private in-memory copy of the file (see
    /// [`GgufFile::load`]): whatever happens to the file afterwards, the daemon keeps
    /// serving the weights it loaded.
    pub fn load(path: &Path) -> Result<Self, LoadError> {
        let file = GgufFile::load(path).map_err(|source| LoadError::Gguf {
            path: path.into(),
            source,
        })?;
        Self::from_file(file, path)
    }

    /// Loads the model over a read-only mapping of the file, for a backend that copies
    /// the weights elsewhere (the GPU) and never reads them on the host afterwards: a
    /// host copy would hold the model twice (on unified-memory machines, in the same
    /// memory as the device copy).
    pub fn load_mapped(path: &Path) -> Result<Self, LoadError> {
        let file = GgufFile::open(path).map_err(|source| LoadError::Gguf {
            path: path.into(),
            source,
        })?;
        Self::from_file_with(file, path, false)
    }

    /// A model over `file` in the file's own layout, for a device backend (tests).
    pub fn from_file_unpacked(file: GgufFile, path: &Path) -> Result<Self, LoadError> {
        Self::from_file_with(file, path, false)
    }

    /// A model over `file`, its weights laid out for the CPU kernels.
    pub fn from_file(file: GgufFile, path: &Path) -> Result<Self, LoadError> {
        Self::from_file_with(file, path, true)
    }

    fn from_file_with(file: GgufFile, path: &Path, for_cpu: bool) -> Result<Self, LoadError> {
        let config =
            ModelConfig::from_metadata(file.metadata()).map_err(|source| LoadError::Config {
                path: path.into(),
                source,
            })?;
        let weights = if for_cpu {
            Weights::load(&file, &config)
        } else {
            Weights::load_unpacked(&file, &config)
        };
        let weights = weights.map_err(|source| LoadError::Weights {
            path: path.into(),
            source,
        })?;
        Ok(Model {
            file,
            config,
            weights,
            path: path.into(),
        })
    }

    /// The most common matrix type of the file, e.g. `Q4_1` (what users call the
    /// model's quantization).
    pub fn quantization(&self) -> String {
        let mut counts = std::collections::HashMap::new();
        for t in self.file.tensors().iter().filter(|t| t.dims.len() == 2) {
            *counts.entry(t.ty).or_insert(0u64) += t.n_elems();
        }
        counts
            .into_iter()
            .max_by_key(|&(_, n)| n)
            .map_or_else(|| "unknown".into(), |(ty, _)| ty.to_string())
    }

    pub fn parameter_count(&self) -> u64 {
        self.weights.parameter_count(&self.config)
    }

    /// Bytes of KV cache one position takes across all layers.
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.config.n_layers * self.config.kv_dim() * std::mem::size_of::<f32>()
    }

    pub fn new_kv_cache(&self, tokens: usize) -> KvCache {
        KvCache::new(self.config.n_layers, self.config.kv_dim(), tokens)
    }
}

#[cfg(test)]
mod tests;
