//! `spark serve-openai`: the OpenAI-compatible HTTP shim in front of the daemon, until
//! SIGINT or SIGTERM.

use std::process::ExitCode;

use spark_client::openai::{serve_openai, ServeOpenAiArgs};
use tokio_util::sync::CancellationToken;

use crate::{
    connect::{self, Autostart},
    exit, output, Global,
};

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
    check_daemon(global).await?;
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

/// Before listening, as `spark run` does: a daemon started if none answers (with
/// `--model`, unless `--no-start`), and `--model` refused when the running daemon
/// serves another. A daemon that cannot be reached now is not an error: the shim
/// answers 503 and connects when one is up.
async fn check_daemon(global: &Global) -> anyhow::Result<()> {
    let client = match connect::connect(global, Autostart::Allowed).await {
        Ok(client) => client,
        Err(err) => {
            tracing::warn!("{err:#}; serving anyway, and connecting when a daemon answers");
            return Ok(());
        }
    };
    let Some(asked) = global.requested_model() else {
        return Ok(());
    };
    let models = client.models().await?;
    let serves = |m: &spark_client::protocol::ModelInfo| {
        spark_client::models::names_model(&asked, &m.name, std::path::Path::new(&m.path))
    };
    if !models.iter().any(serves) {
        let loaded: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
        anyhow::bail!(
            "--model {asked}: the daemon serves {}; a daemon serves one model, so stop it \
             (`spark stop` stops one that spark started) and run again with --model",
            loaded.join(", ")
        );
    }
    Ok(())
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
