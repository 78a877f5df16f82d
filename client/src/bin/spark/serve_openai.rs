//! `spark serve-openai`: the OpenAI-compatible HTTP shim in front of the daemon, until
//! SIGINT or SIGTERM.

use std::process::ExitCode;

use spark_client::openai::{serve_openai, ServeOpenAiArgs};
use tokio_util::sync::CancellationToken;

use crate::{exit, output, Global};

/// The shim's flags (kept out of `Debug`: one of them is a secret).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    inner: ServeOpenAiArgs,
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Args")
            .field("listen", &self.inner.listen)
            .finish_non_exhaustive()
    }
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let args = args.inner;
    init_logging();
    let socket = spark_client::resolve_socket_path(global.socket.as_deref());
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        on_signal.cancel();
    });
    serve_openai(args.into_config(socket), shutdown).await?;
    Ok(exit::code(exit::OK))
}

/// Request logs (counts, statuses, never bodies) to stderr; `RUST_LOG` adjusts them.
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour codes only for a person at a terminal: not in a log file or the journal.
        .with_ansi(
            output::stderr_is_tty() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .try_init();
}
