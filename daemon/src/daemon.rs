//! `sparkd serve`: load the model, start the engine, serve the socket until a signal,
//! then shut down gracefully.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::cli::{model_path, DeviceArg, ServeArgs};
use crate::engine::{Engine, EngineConfig, EngineHandle};
use crate::model::Model;
use crate::server::{self, ServerConfig};

/// Logs go to journald when systemd runs us (it sets JOURNAL_STREAM), else to stderr.
pub fn init_logging() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let journald = std::env::var_os("JOURNAL_STREAM").and_then(|_| tracing_journald::layer().ok());
    let registry = tracing_subscriber::registry().with(filter);
    let result = match journald {
        Some(layer) => registry.with(layer).try_init(),
        None => registry.with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr)).try_init(),
    };
    // A second init (tests) is harmless.
    let _ = result;
}

/// The name clients use for the model: the known name, or the file's stem for a path.
fn model_name(arg: &str, path: &Path) -> String {
    if Path::new(arg).is_file() {
        path.file_stem().map_or_else(|| arg.to_string(), |s| s.to_string_lossy().into_owned())
    } else {
        arg.to_string()
    }
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging();
    match args.device {
        DeviceArg::Cuda => anyhow::bail!(
            "--device cuda: this build of sparkd has no CUDA backend yet; use --device cpu or --device auto"
        ),
        DeviceArg::Auto => tracing::info!("device auto: using the CPU backend (no CUDA backend in this build)"),
        DeviceArg::Cpu => {}
    }
    let path = model_path(&args.model, !args.no_pull)?;
    let name = model_name(&args.model, &path);
    let started = std::time::Instant::now();
    let model = Model::load(&path)?;
    let mut cfg = EngineConfig::new(name.clone());
    if let Some(t) = args.threads {
        cfg.threads = t.max(1);
    }
    cfg.kv_tokens = args.kv_tokens;
    cfg.context_limit = args.ctx;
    cfg.max_running = args.max_running;
    cfg.max_queued = args.max_queued;
    cfg.step_tokens = args.step_tokens;
    cfg.keep_jobs = args.keep_jobs;
    if let Some(p) = &args.chat_template {
        cfg.chat_template =
            Some(std::fs::read_to_string(p).with_context(|| format!("reading chat template {}", p.display()))?);
    }
    let engine = EngineHandle::start(model, cfg)?;
    tracing::info!(model = %name, path = %path.display(), load_ms = started.elapsed().as_millis() as u64, "model loaded");

    let socket_path = spark_client::resolve_socket_path(args.socket.as_deref());
    let server_cfg = ServerConfig {
        socket_path: socket_path.clone(),
        max_frame_bytes: args.max_frame_bytes,
        ..ServerConfig::default()
    };
    let grace = Duration::from_secs_f64(args.shutdown_grace.max(0.0));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("sparkd-io")
        .build()
        .context("starting the async runtime")?;
    let result = rt.block_on(run_server(server_cfg, engine.clone(), grace));
    engine.shutdown(Duration::ZERO);
    engine.join();
    let _ = std::fs::remove_file(pid_file(&socket_path));
    result
}

fn pid_file(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".pid");
    PathBuf::from(p)
}

async fn run_server(cfg: ServerConfig, engine: Arc<EngineHandle>, grace: Duration) -> anyhow::Result<()> {
    let listener = server::bind(&cfg).await?;
    let pid_path = pid_file(&cfg.socket_path);
    if let Err(e) = std::fs::write(&pid_path, format!("{}\n", std::process::id())) {
        tracing::warn!(path = %pid_path.display(), error = %e, "cannot write pid file");
    }
    tracing::info!(socket = %cfg.socket_path.display(), "serving");
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone(), engine.clone(), grace));
    let dyn_engine: Arc<dyn Engine> = engine;
    server::serve(listener, cfg, dyn_engine, shutdown).await?;
    Ok(())
}

/// First SIGTERM/SIGINT: stop accepting and let generations finish within `grace`.
/// A second one: end every generation now.
async fn watch_signals(shutdown: CancellationToken, engine: Arc<EngineHandle>, grace: Duration) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!(grace_s = grace.as_secs_f64(), "shutting down: finishing running generations");
    shutdown.cancel();
    engine.shutdown(grace);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("second signal: ending every generation now");
    engine.shutdown(Duration::ZERO);
}
