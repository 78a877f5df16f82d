//! Fetching models into the local model directory. Placeholder: the real implementation
//! replaces this file.

use std::path::PathBuf;

/// The model `spark pull` fetches when given no name.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    #[error("pulling models is not implemented yet (wanted `{0}`)")]
    NotImplemented(String),
}

/// Downloads model `name` if it is not already present and returns its path.
pub fn pull(name: &str) -> Result<PathBuf, ModelsError> {
    Err(ModelsError::NotImplemented(name.to_owned()))
}
