//! `sparkd serve`: load the model, start the engine, serve the socket until a signal,
//! then shut down gracefully.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use spark_client::models::DEFAULT_MODEL;

use crate::backend::{self, cuda::DeviceChoice, cuda::DeviceRequest};
use crate::cli::{model_path, ServeArgs};
use crate::engine::{Engine, EngineConfig, EngineHandle};
use crate::model::Model;
use crate::notify;
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
        None => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(stderr_wants_color()),
            )
            .try_init(),
    };
    // A second init (tests) is harmless.
    let _ = result;
}

/// Colours only for a person at a terminal: a log file (`spark`'s auto-started daemon
/// writes one) or a pipe gets plain text, and `NO_COLOR` turns them off anywhere.
fn stderr_wants_color() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The longest duration a flag takes: more would overflow clock arithmetic (an `Instant`
/// plus an unbounded duration panics).
const MAX_FLAG_SECS: f64 = 365.0 * 86_400.0;

/// A flag given in seconds as a duration, refused unless it is a number of seconds from
/// 0 (or just above, when zero makes no sense) up to a year.
fn seconds_flag(flag: &str, secs: f64, zero_allowed: bool) -> anyhow::Result<Duration> {
    let lowest_ok = if zero_allowed {
        secs >= 0.0
    } else {
        secs > 0.0
    };
    anyhow::ensure!(
        lowest_ok && secs <= MAX_FLAG_SECS,
        "{flag} {secs}: expected a number of seconds {} up to {MAX_FLAG_SECS}",
        if zero_allowed { "from 0" } else { "above 0" }
    );
    Ok(Duration::from_secs_f64(secs))
}

/// Smallest `--ctx`: one KV block, a short prompt and its answer.
const MIN_CONTEXT: usize = crate::model::BLOCK_TOKENS;
/// Smallest `--max-frame-bytes`: under it even a short request would not fit.
const MIN_FRAME_BYTES: usize = 4096;

/// Refuses limits under which the daemon would start and then refuse every request.
fn check_limits(args: &ServeArgs) -> anyhow::Result<()> {
    if let Some(ctx) = args.ctx {
        anyhow::ensure!(
            ctx >= MIN_CONTEXT,
            "--ctx {ctx}: a context must hold at least {MIN_CONTEXT} tokens"
        );
    }
    if let Some(bytes) = args.max_frame_bytes {
        anyhow::ensure!(
            bytes >= MIN_FRAME_BYTES,
            "--max-frame-bytes {bytes}: at least {MIN_FRAME_BYTES} bytes, or no request fits"
        );
    }
    Ok(())
}

/// The name clients use for the model: the known name, or the file's stem for a path.
fn model_name(arg: &str, path: &Path) -> String {
    if Path::new(arg).is_file() {
        path.file_stem()
            .map_or_else(|| arg.to_string(), |s| s.to_string_lossy().into_owned())
    } else {
        arg.to_string()
    }
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    init_logging();
    // Kept as given, so SIGHUP can merge the command line over the re-read config file.
    let cli_args = args.clone();
    let args = args.with_config_file()?;
    check_limits(&args)?;
    // Before the socket and the model: `--device cuda` on a machine without a usable GPU
    // is refused at once, with the probe's reason; `auto` logs what it chose and why.
    let request = args.device.unwrap_or_default();
    let choice = backend::cuda::probe(request).with_context(|| format!("--device {request}"))?;
    let model_arg = args
        .model
        .clone()
        .unwrap_or_else(|| DEFAULT_MODEL.to_string());
    let socket_path = spark_client::resolve_socket_path(args.socket.as_deref());
    let grace = seconds_flag(
        "--shutdown-grace",
        args.shutdown_grace.unwrap_or(30.0),
        true,
    )?;
    // Flags that read a file or parse text: checked before the socket is bound and the
    // model loaded (a minute for a large one), so a typo fails at once.
    let chat_template = args
        .chat_template
        .as_ref()
        .map(|p| {
            std::fs::read_to_string(p)
                .with_context(|| format!("--chat-template {}: cannot read it", p.display()))
        })
        .transpose()?;
    let chat_template_vars = args
        .chat_template_kwargs
        .as_deref()
        .map(|json| {
            crate::text::TemplateVars::parse(json)
                .map_err(|e| anyhow::anyhow!("{e} (in --chat-template-kwargs)"))
        })
        .transpose()?;
    let mut server_cfg = ServerConfig::new(socket_path.clone());
    server_cfg.max_frame_bytes = args.max_frame_bytes.unwrap_or(server_cfg.max_frame_bytes);
    // Who may connect besides root and the daemon's own user (always allowed): the
    // configured users and groups, and by default the members of the `sparkd` group.
    server_cfg.allowed_uids = Some(args.allowed_uids.clone().unwrap_or_default());
    server_cfg.allowed_gids = Some(
        args.allowed_gids
            .clone()
            .unwrap_or_else(|| sparkd_group().into_iter().collect()),
    );
    if let Some(secs) = args.stall_timeout {
        server_cfg.stall_timeout = Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| {
                format!("--stall-timeout {secs}: expected a positive number of seconds")
            })?;
    }
    // Connections outlive the engine's grace a little, so every stream's final `Done`
    // (sent when the grace ends) still reaches its client.
    server_cfg.shutdown_grace = grace + Duration::from_secs(5);
    // Before any other thread exists: taking the fds clears LISTEN_* from the environment.
    let activated = notify::activated_listener().context("taking the socket passed by systemd")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name("sparkd-io")
        .build()
        .context("starting the async runtime")?;

    // The socket first: a second daemon is refused before it loads anything, and clients
    // that connect while the model loads wait in the listen backlog instead of failing.
    let listener = rt.block_on(listen(&server_cfg, activated))?;
    let _pid_file = PidFile(pid_file(&socket_path));
    notify::status(&format!("loading model {model_arg}"));
    let started = std::time::Instant::now();
    let path = model_path(&model_arg, !args.no_pull)?;
    let name = model_name(&model_arg, &path);
    // Taken before reading, so a change during the load is noticed too.
    let identity = crate::model_watch::FileIdentity::of(&path).ok();
    // The CPU serves from a private copy; a GPU gets the weights uploaded from a mapping.
    let loaded = match &choice {
        DeviceChoice::Cuda { .. } => Model::load_mapped(&path),
        _ => Model::load(&path),
    };
    let model = loaded?;
    let mut cfg = EngineConfig::new(name.clone());
    if let Some(t) = args.threads {
        cfg.threads = t.max(1);
    }
    cfg.kv_tokens = args.kv_tokens.unwrap_or(cfg.kv_tokens);
    cfg.context_limit = args.ctx;
    cfg.max_running = args.max_running.unwrap_or(cfg.max_running);
    cfg.max_queued = args.max_queued.unwrap_or(cfg.max_queued);
    cfg.step_tokens = args.step_tokens.unwrap_or(cfg.step_tokens);
    if let Some(ms) = args.step_target_ms {
        anyhow::ensure!(
            (0.0..=60_000.0).contains(&ms),
            "--step-target-ms {ms:?}: expected a number of milliseconds from 0 up to 60000"
        );
        cfg.step_target = (ms > 0.0).then(|| Duration::from_secs_f64(ms / 1e3));
    }
    cfg.max_per_uid = args.max_per_uid;
    cfg.keep_jobs = args.keep_jobs.unwrap_or(cfg.keep_jobs);
    cfg.prefix_cache = args.prefix_cache.unwrap_or(cfg.prefix_cache);
    cfg.chat_template = chat_template;
    if let Some(vars) = chat_template_vars {
        // Names only: the values may be text a user wrote.
        let names: Vec<&str> = vars.names().collect();
        tracing::info!(names = ?names, "chat template variables set for every chat");
        cfg.chat_template_vars = vars;
    }
    let cuda = backend::cuda::CudaOptions {
        kv_tokens: cfg.kv_tokens,
        graphs: args.cuda_graphs.unwrap_or(true),
        pdl: args.cuda_pdl.unwrap_or(true),
        ..Default::default()
    };
    let engine = start_engine(model, &path, cfg, cuda, request, &choice)?;
    tracing::info!(model = %name, path = %path.display(), load_ms = started.elapsed().as_millis() as u64, "model loaded");

    let access = server::Access::for_this_process(&server_cfg);
    let reload = Reload {
        cli_args,
        access: access.clone(),
        engine: engine.clone(),
    };
    let watched = identity.map(|id| (path.clone(), id));
    let result = rt.block_on(run_server(
        listener,
        server_cfg,
        access,
        engine.clone(),
        grace,
        reload,
        watched,
    ));
    engine.shutdown(Duration::ZERO);
    engine.join();
    result
}

/// The pid file `listen` wrote beside the socket, removed when the daemon ends however
/// it ends: a normal stop, a model that fails to load, or any error after the socket was
/// bound. (A stale one would make `spark stop` look for a process that is gone.)
struct PidFile(PathBuf);

impl Drop for PidFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The engine on the device the probe chose. A GPU that passed the probe but cannot
/// take the model (kernels that do not load, not enough memory) is an error under
/// `cuda`, and under `auto` a warning and the CPU.
fn start_engine(
    model: Model,
    path: &Path,
    cfg: EngineConfig,
    cuda_opts: backend::cuda::CudaOptions,
    request: DeviceRequest,
    choice: &DeviceChoice,
) -> anyhow::Result<Arc<EngineHandle>> {
    let DeviceChoice::Cuda { gpu, arch, .. } = choice else {
        return Ok(EngineHandle::start(model, cfg)?);
    };
    let model = Arc::new(model);
    let cuda = backend::cuda::CudaGpu::new(gpu.ordinal, *arch)
        .and_then(|dev| backend::CudaBackend::new(&model, dev, cuda_opts));
    match cuda {
        Ok(b) => Ok(EngineHandle::start_with_backend(model, Box::new(b), cfg)?),
        Err(e) if request == DeviceRequest::Auto => {
            tracing::warn!(error = %e, gpu = %gpu.name, "the GPU cannot run this model; using the CPU");
            // The CPU reads the weights for every step: from its own copy, not the mapping.
            drop(model);
            let model = Arc::new(Model::load(path)?);
            let backend = backend::CpuBackend::new(model.clone(), cfg.kv_tokens, cfg.threads);
            Ok(EngineHandle::start_with_backend(
                model,
                Box::new(backend),
                cfg,
            )?)
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("--device {request}: {}", gpu.name))),
    }
}

/// The listening socket: the one systemd passed (socket activation), else our own.
async fn listen(
    cfg: &ServerConfig,
    activated: Option<std::os::unix::net::UnixListener>,
) -> anyhow::Result<server::Listener> {
    if let Some(std_listener) = activated {
        tracing::info!("using the socket passed by systemd");
        return Ok(server::Listener::from_std(std_listener)?);
    }
    let listener = server::bind(cfg).await?;
    let pid_path = pid_file(&cfg.socket_path);
    if let Err(e) = std::fs::write(&pid_path, format!("{}\n", std::process::id())) {
        tracing::warn!(path = %pid_path.display(), error = %e, "cannot write pid file");
    }
    Ok(listener)
}

fn pid_file(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".pid");
    PathBuf::from(p)
}

async fn run_server(
    listener: server::Listener,
    cfg: ServerConfig,
    access: server::Access,
    engine: Arc<EngineHandle>,
    grace: Duration,
    reload: Reload,
    watched: Option<(PathBuf, crate::model_watch::FileIdentity)>,
) -> anyhow::Result<()> {
    tracing::info!(socket = %cfg.socket_path.display(), "serving");
    notify::ready(&engine);
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone(), engine.clone(), grace));
    tokio::spawn(notify::keep_alive(engine.clone(), shutdown.clone()));
    tokio::spawn(watch_reload(reload, shutdown.clone()));
    if let Some((path, identity)) = watched {
        tokio::spawn(crate::model_watch::watch(path, identity, shutdown.clone()));
    }
    let dyn_engine: Arc<dyn Engine> = engine;
    server::serve_with_access(listener, cfg, dyn_engine, shutdown, access).await?;
    Ok(())
}

/// What SIGHUP re-reads and where it applies it.
struct Reload {
    cli_args: ServeArgs,
    access: server::Access,
    engine: Arc<EngineHandle>,
}

impl Reload {
    /// Re-reads the config file (flags still win) and applies the allow-lists and the
    /// queue limits. Connections and running generations are not touched.
    fn apply(&self) -> anyhow::Result<()> {
        let args = self.cli_args.clone().with_config_file()?;
        let gids = args
            .allowed_gids
            .clone()
            .unwrap_or_else(|| sparkd_group().into_iter().collect());
        self.access.update(
            Some(args.allowed_uids.clone().unwrap_or_default()),
            Some(gids),
        );
        let mut limits = self.engine.queue_limits();
        if let Some(q) = args.max_queued {
            limits.max_queued = q;
        }
        limits.max_per_uid = args.max_per_uid;
        self.engine.set_queue_limits(limits);
        tracing::info!(
            max_queued = limits.max_queued,
            max_per_uid = ?limits.max_per_uid,
            allowed_uids = ?args.allowed_uids,
            allowed_gids = ?args.allowed_gids,
            "configuration reloaded"
        );
        Ok(())
    }
}

async fn watch_reload(reload: Reload, shutdown: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::error!("cannot install the SIGHUP handler");
        return;
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = hup.recv() => {
                notify::reloading();
                if let Err(e) = reload.apply() {
                    tracing::error!(error = %format!("{e:#}"), "reload failed; keeping the previous settings");
                }
                notify::ready(&reload.engine);
            }
        }
    }
}

/// First SIGTERM/SIGINT: stop accepting and let generations finish within `grace`.
/// A second one: end every generation now.
async fn watch_signals(shutdown: CancellationToken, engine: Arc<EngineHandle>, grace: Duration) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers");
        return;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!(
        grace_s = grace.as_secs_f64(),
        "shutting down: finishing running generations"
    );
    notify::stopping();
    shutdown.cancel();
    engine.shutdown(grace);
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
    tracing::info!("second signal: ending every generation now");
    engine.shutdown(Duration::ZERO);
}

/// The gid of the `sparkd` group, when the system has one.
fn sparkd_group() -> Option<u32> {
    let name = std::ffi::CString::new("sparkd").ok()?;
    // SAFETY: getgrnam reads the group database and returns a pointer to static storage
    // (or null); we copy the one field we need before any other call can overwrite it.
    let group = unsafe { libc::getgrnam(name.as_ptr()) };
    // SAFETY: non-null pointers from getgrnam point to a valid `struct group`.
    (!group.is_null()).then(|| unsafe { (*group).gr_gid })
}
