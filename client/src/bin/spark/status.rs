//! `spark status`: what the daemon is running and how loaded it is.

use std::process::ExitCode;

use spark_client::{
    protocol::{CacheReport, ChatFormatReport, StatusReport},
    ClientError,
};

use crate::{
    connect::{self, Autostart},
    exit, format, output, Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The daemon's report as one JSON object
    #[arg(long)]
    pub json: bool,
}

/// `--json`: the daemon's `StatusReport`, plus `prefix_cache` (null from a daemon older
/// than protocol 1.2) and `chat_format` (null before 1.8), the same shape as the shim's
/// `/v1/status`.
#[derive(Debug, serde::Serialize)]
struct StatusJson<'a> {
    #[serde(flatten)]
    status: &'a StatusReport,
    prefix_cache: Option<&'a CacheReport>,
    chat_format: Option<&'a ChatFormatReport>,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let client = connect::connect(global, Autostart::Never).await?;
    let status = client.status().await?;
    let cache = match client.cache_status().await {
        Ok(cache) => Some(cache),
        // An older daemon: its report has everything but the cache.
        Err(ClientError::VersionMismatch { .. }) => None,
        Err(err) => return Err(err.into()),
    };
    let chat = match client.chat_format().await {
        Ok(chat) => Some(chat),
        Err(ClientError::VersionMismatch { .. }) => None,
        Err(err) => return Err(err.into()),
    };
    if args.json {
        let json = StatusJson {
            status: &status,
            prefix_cache: cache.as_ref(),
            chat_format: chat.as_ref(),
        };
        output::out_line(&serde_json::to_string_pretty(&json)?)?;
    } else {
        output::out_line(&format::status_text(&status, cache.as_ref(), chat.as_ref()))?;
    }
    Ok(exit::code(exit::OK))
}
