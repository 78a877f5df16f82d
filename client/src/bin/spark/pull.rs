//! `spark pull`: fetch a model into the local model directory.

use std::process::ExitCode;

use anyhow::Context;
use spark_client::models;

use crate::{exit, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model to fetch
    #[arg(default_value = models::DEFAULT_MODEL)]
    pub name: String,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.name;
    // Downloading blocks; keep it off the runtime's thread.
    let path = tokio::task::spawn_blocking(move || models::pull(&name))
        .await
        .context("the download task failed")??;
    output::out_line(&path.display().to_string())?;
    Ok(exit::code(exit::OK))
}
