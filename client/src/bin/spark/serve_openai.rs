//! `spark serve-openai`: the OpenAI-compatible HTTP API (and its web page) in front of
//! the daemon, until Ctrl-C or SIGTERM.

use std::process::ExitCode;

use anyhow::Context;
use spark_client::openai::{serve_openai, ServeOpenAiArgs};
use spark_client::resolve_socket_path;
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::{exit, Global};

/// The library's flags, wrapped so that the CLI's `Debug` never shows the API key.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    flags: ServeOpenAiArgs,
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("listen", &self.flags.listen)
            .field("api_key", &self.flags.api_key.as_ref().map(|_| "<set>"))
            .field("max_body_bytes", &self.flags.max_body_bytes)
            .finish()
    }
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let config = args
        .flags
        .into_config(resolve_socket_path(global.socket.as_deref()));
    let shutdown = CancellationToken::new();
    // Catch both before serving, so an early signal is not lost to the default handler.
    let mut interrupts = signal(SignalKind::interrupt()).context("cannot catch Ctrl-C")?;
    let mut terminates = signal(SignalKind::terminate()).context("cannot catch SIGTERM")?;
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = interrupts.recv() => {}
            _ = terminates.recv() => {}
        }
        trigger.cancel();
    });
    serve_openai(config, shutdown).await?;
    Ok(exit::code(exit::OK))
}
