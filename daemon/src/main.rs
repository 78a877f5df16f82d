//! `sparkd`: the daemon binary. Argument parsing and dispatch only; everything of
//! substance lives in the library.

use std::process::ExitCode;

use clap::Parser;
use sparkd::cli::{Cli, Cmd};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Cmd::Serve(Box::default())) {
        Cmd::Serve(args) => sparkd::daemon::serve(*args),
        // The backend's warnings (a capture refused, memory not page-locked...) explain
        // figures: on stderr, which gpu-check.sh keeps in its log.
        Cmd::Bench(args) => {
            sparkd::daemon::init_logging();
            sparkd::cli::bench(args)
        }
        Cmd::Pull(args) => sparkd::cli::pull(args),
        Cmd::Synth(args) => sparkd::cli::synth(args),
        // gpu-check.sh tells a mismatch (1) from an error (2) by the exit status.
        Cmd::GpuParity(args) => {
            sparkd::daemon::init_logging();
            return match sparkd::cli::gpu_parity(args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    eprintln!("sparkd: {e:#}");
                    ExitCode::from(2)
                }
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sparkd: {e:#}");
            ExitCode::FAILURE
        }
    }
}
