//! `sparkd`: the daemon binary. Argument parsing and dispatch only; everything of
//! substance lives in the library.

use clap::Parser;
use sparkd::cli::{Cli, Cmd};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Cmd::Serve(Box::default())) {
        Cmd::Serve(args) => sparkd::daemon::serve(*args),
        Cmd::Bench(args) => sparkd::cli::bench(args),
        Cmd::Pull(args) => sparkd::cli::pull(args),
        Cmd::Synth(args) => sparkd::cli::synth(args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sparkd: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
