//! `sparkd-load`: a load and soak harness for sparkd. Prints figures and the result of
//! each check; exits non-zero when a check fails. Not a timed test: nothing here passes
//! or fails on speed.
//!
//! ```sh
//! cargo build --workspace --bins
//! target/debug/sparkd-load                        # own daemon on the tiny synthetic model
//! target/debug/sparkd-load --shim                 # and the same through the OpenAI shim
//! target/debug/sparkd-load --model ~/.local/share/sparkd/models/smollm2-135m-instruct.gguf
//! target/debug/sparkd-load --socket /run/user/1000/sparkd/sparkd.sock --duration 600
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use sparkd_e2e::load::plan::PlanShape;
use sparkd_e2e::load::shim::{run_shim_round, ShimLoadOptions};
use sparkd_e2e::load::{run_socket_load, LoadOptions};
use sparkd_e2e::{tiny_model, Daemon, Shim};

#[derive(Debug, Parser)]
#[command(
    name = "sparkd-load",
    about = "Load and soak harness for sparkd: concurrent clients, random requests, cancels and hang-ups, then accounting checks",
    after_help = "Memory: the daemon's idle resident memory after each round is compared with its \
                  idle level after warm-up rounds at the same concurrency. The first bursts grow \
                  the allocator's arenas and the engine's buffers to their high-water mark (on \
                  the synthetic model that takes about two rounds), and they keep it for reuse; \
                  a leak shows as growth past that level, round after round. Only growth \
                  beyond the tolerance fails. The prefix cache keeps finished prompts' KV \
                  blocks, so a daemon's KV memory grows until --kv-tokens is full: the daemon \
                  this harness starts has a cache (4096 tokens) that the warm-up fills; \
                  against another, warm up long enough to fill its cache, or run it with \
                  --prefix-cache off. The daemon this harness starts keeps exactly \
                  --requests jobs, so its jobs list is full (steady) from the first warm-up on."
)]
struct Args {
    /// Concurrent socket clients, each on its own connection.
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Requests per round.
    #[arg(long, default_value_t = 1000)]
    requests: usize,
    /// Share of requests cancelled (Cancel message) or hung up on (connection dropped), half each.
    #[arg(long, default_value_t = 0.2)]
    cancel_fraction: f64,
    /// Soak: repeat rounds until this many seconds have passed.
    #[arg(long)]
    duration: Option<f64>,
    /// Warm-up rounds (of --requests each) before the memory baseline is taken (0: no
    /// memory check).
    #[arg(long, default_value_t = 2)]
    warmup_rounds: usize,
    /// RNG seed for the requests.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Upper bound of the random max_tokens.
    #[arg(long, default_value_t = 64)]
    max_tokens: u32,
    /// Upper bound of the random prompt length, in words.
    #[arg(long, default_value_t = 40)]
    max_prompt_words: usize,
    /// Allowed growth of idle resident memory over the post-warm-up level, in percent...
    #[arg(long, default_value_t = 5.0)]
    memory_tolerance: f64,
    /// ...or in MiB, whichever is larger (allocator granularity on a small daemon).
    #[arg(long, default_value_t = 1.0)]
    memory_slack_mib: f64,
    /// An already running daemon (it must keep at least --requests jobs: `sparkd serve
    /// --keep-jobs`; nothing else should use it meanwhile).
    #[arg(long, conflicts_with = "model")]
    socket: Option<PathBuf>,
    /// Model for the daemon this harness starts [default: the tiny synthetic model].
    #[arg(long)]
    model: Option<PathBuf>,
    /// Also run a round through `spark serve-openai`.
    #[arg(long)]
    shim: bool,
    /// Concurrent HTTP clients of the shim round.
    #[arg(long, default_value_t = 32)]
    shim_clients: usize,
    /// Requests of the shim round [default: --requests].
    #[arg(long)]
    shim_requests: Option<usize>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sparkd-load: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("sparkd-load: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> anyhow::Result<bool> {
    let opts = LoadOptions {
        clients: args.clients,
        requests: args.requests,
        shape: PlanShape {
            cancel_fraction: args.cancel_fraction,
            max_tokens: args.max_tokens,
            max_prompt_words: args.max_prompt_words,
        },
        seed: args.seed,
        warmup_rounds: args.warmup_rounds,
        duration: args.duration.map(Duration::from_secs_f64),
        memory_tolerance: args.memory_tolerance / 100.0,
        memory_slack: (args.memory_slack_mib.max(0.0) * (1u64 << 20) as f64) as u64,
        ..LoadOptions::default()
    };
    // Our own daemon keeps exactly enough jobs for a round to be checked against the
    // list, and the warm-up round fills that list, so that it weighs the same in the
    // memory baseline as after every later round.
    let keep = args
        .requests
        .max(args.shim_requests.unwrap_or(0))
        .max(1)
        .to_string();
    let daemon = match &args.socket {
        Some(_) => None,
        None => {
            let model = args.model.clone().unwrap_or_else(tiny_model);
            println!("starting sparkd on {}", model.display());
            Some(Daemon::start(&model, &["--keep-jobs", &keep]))
        }
    };
    let socket = match (&args.socket, &daemon) {
        (Some(s), _) => s.clone(),
        (None, Some(d)) => d.socket.clone(),
        (None, None) => unreachable!("a daemon was started"),
    };
    println!(
        "socket load: {} clients, {} requests per round, {:.0}% cancelled or hung up, seed {}",
        opts.clients,
        opts.requests,
        opts.shape.cancel_fraction * 100.0,
        opts.seed
    );
    let report = run_socket_load(&socket, &opts, |round| print!("{round}")).await?;
    let mut passed = report.passed();
    if let Some(base) = report.baseline_resident {
        println!(
            "memory baseline: {} idle after warm-up",
            sparkd_e2e::load::report::mib(base)
        );
    }

    if args.shim {
        let shim = Shim::start(&socket, &[]);
        let control = spark_client::Client::connect(&socket).await?;
        let shim_opts = ShimLoadOptions {
            clients: args.shim_clients,
            requests: args.shim_requests.unwrap_or(args.requests),
            drop_fraction: args.cancel_fraction,
            seed: args.seed,
            max_tokens: args.max_tokens,
            timeout: Duration::from_secs(120),
            shim_pid: shim.child.id(),
        };
        println!(
            "shim load: {} HTTP clients, {} requests, {:.0}% hung up mid-stream, on {}",
            shim_opts.clients,
            shim_opts.requests,
            shim_opts.drop_fraction * 100.0,
            shim.url("")
        );
        let round = run_shim_round(&shim.url(""), &control, &shim_opts).await?;
        print!("{round}");
        passed &= round.passed();
    }
    if let Some(d) = &daemon {
        let log = d.log_text();
        let panics = log.lines().filter(|l| l.contains("panicked")).count();
        if panics > 0 {
            println!("  [FAIL] the daemon's log shows {panics} panic(s)");
            passed = false;
        }
    }
    println!("result: {}", if passed { "PASS" } else { "FAIL" });
    Ok(passed)
}
