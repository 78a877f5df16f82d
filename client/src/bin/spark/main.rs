//! `spark`: the command-line client of sparkd.

mod autostart;
mod bench;
mod chat;
mod connect;
mod exit;
mod format;
mod jobs;
mod json;
mod models;
mod output;
mod pull;
mod request;
mod run;
mod serve_openai;
mod status;
mod stop;
mod stream;
mod tokenize;

use std::{ffi::OsString, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "spark",
    version,
    about = "Run prompts on the resident sparkd daemon",
    after_help = "A prompt with spaces in place of a command runs it: spark \"Why is the sky blue?\" \
                  is spark run \"Why is the sky blue?\"."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand takes.
#[derive(Debug, Clone, clap::Args)]
pub struct Global {
    /// The daemon's socket [default: $SPARKD_SOCKET, else $XDG_RUNTIME_DIR/sparkd/sparkd.sock]
    #[arg(long, global = true, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The model to answer with (a name or a GGUF path); an auto-started daemon loads it
    #[arg(long, global = true, value_name = "MODEL")]
    pub model: Option<String>,
    /// Never start sparkd automatically (same as SPARKD_NO_AUTOSTART=1)
    #[arg(long, global = true)]
    pub no_start: bool,
}

impl Global {
    /// The model a generation asks for, as the daemon knows it: `--model` as given, or
    /// for a GGUF file its absolute path (the daemon's working folder is not ours). A
    /// daemon serving another model refuses the request instead of answering with it.
    pub fn requested_model(&self) -> Option<String> {
        let model = self.model.as_deref()?;
        let as_path = std::path::Path::new(model);
        let canonical = as_path
            .is_file()
            .then(|| std::fs::canonicalize(as_path).ok());
        Some(match canonical.flatten() {
            Some(path) => path.to_string_lossy().into_owned(),
            None => model.to_owned(),
        })
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Generate from one prompt; the answer to stdout, reasoning and a stats line to stderr
    Run(run::Args),
    /// Chat interactively (Ctrl-C stops an answer, /clear starts over, Ctrl-D or /exit leaves)
    Chat(chat::Args),
    /// List recent generations with their counts and timings
    Jobs(jobs::Args),
    /// Show the daemon's model, device, memory and load
    Status(status::Args),
    /// Show how the loaded model tokenizes a text
    Tokenize(tokenize::Args),
    /// Stop a daemon that `spark` started
    Stop,
    /// Download a model
    Pull(pull::Args),
    /// List the models in the models folder, the one the daemon has loaded, and the known ones to pull
    #[command(visible_alias = "list")]
    Models(models::Args),
    /// Serve the OpenAI-compatible HTTP API (and the web page) in front of the daemon
    ServeOpenai(serve_openai::Args),
    /// Benchmark the running daemon through its socket (optionally against llama-server)
    Bench(bench::Args),
}

fn main() -> ExitCode {
    let cli = parse_cli(std::env::args_os().collect()).unwrap_or_else(|err| err.exit());
    // The HTTP shim serves many clients at once; everything else is one conversation.
    let runtime = match &cli.command {
        Command::ServeOpenai(_) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => return exit::report(err.into()),
    };
    let global = cli.global;
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Run(args) => run::run(&global, args).await,
            Command::Chat(args) => chat::run(&global, args).await,
            Command::Jobs(args) => jobs::run(&global, args).await,
            Command::Status(args) => status::run(&global, args).await,
            Command::Tokenize(args) => tokenize::run(&global, args).await,
            Command::Stop => stop::run(&global).await,
            Command::Pull(args) => pull::run(args).await,
            Command::Models(args) => models::run(&global, args).await,
            Command::ServeOpenai(args) => serve_openai::run(&global, args).await,
            Command::Bench(args) => bench::run(&global, args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(err) => exit::report(err),
    }
}

/// Parses the command line; `spark "some prompt"` is taken as `spark run "some prompt"`.
/// Only a first argument with whitespace in it is read as a prompt: a single unknown
/// word is more likely a mistyped command, which gets clap's suggestion.
fn parse_cli(args: Vec<OsString>) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(&args).or_else(|err| {
        if err.kind() != clap::error::ErrorKind::InvalidSubcommand {
            return Err(err);
        }
        match prompt_as_run(&args).map(Cli::try_parse_from) {
            Some(Ok(cli)) => Ok(cli),
            _ => Err(err),
        }
    })
}

/// `args` with `run` in front of the first positional argument, when that argument has
/// whitespace in it.
fn prompt_as_run(args: &[OsString]) -> Option<Vec<OsString>> {
    // Global options that take a value, as `--flag value` (the `--flag=value` form is
    // one argument).
    const TAKES_VALUE: [&str; 2] = ["--socket", "--model"];
    let mut i = 1;
    while let Some(arg) = args.get(i) {
        let text = arg.to_str()?;
        if TAKES_VALUE.contains(&text) {
            i += 2;
        } else if text.starts_with('-') {
            i += 1;
        } else if text.chars().any(char::is_whitespace) {
            let mut with_run = args.to_vec();
            with_run.insert(i, "run".into());
            return Some(with_run);
        } else {
            return None;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::error::ErrorKind> {
        let args = std::iter::once("spark").chain(args.iter().copied());
        parse_cli(args.map(OsString::from).collect()).map_err(|err| err.kind())
    }

    fn prompt(cli: &Cli) -> Option<&str> {
        match &cli.command {
            Command::Run(args) => args.prompt.as_deref(),
            _ => None,
        }
    }

    #[test]
    fn a_bare_prompt_runs() {
        let cli = parse(&["Name three colors."]).unwrap();
        assert_eq!(prompt(&cli), Some("Name three colors."));
        let cli = parse(&[
            "--socket",
            "/tmp/s.sock",
            "--model=x",
            "hi there",
            "--max-tokens",
            "5",
        ])
        .unwrap();
        assert_eq!(prompt(&cli), Some("hi there"));
        assert_eq!(
            cli.global.socket.as_deref(),
            Some(std::path::Path::new("/tmp/s.sock"))
        );
        assert_eq!(cli.global.model.as_deref(), Some("x"));
    }

    #[test]
    fn commands_and_mistyped_commands_stay_commands() {
        assert!(matches!(
            parse(&["status"]).unwrap().command,
            Command::Status(_)
        ));
        assert_eq!(prompt(&parse(&["run", "a b"]).unwrap()), Some("a b"));
        // One word is a mistyped command, not a prompt.
        assert_eq!(
            parse(&["stauts"]).err(),
            Some(clap::error::ErrorKind::InvalidSubcommand)
        );
        // A value of a global option is not the prompt.
        assert_eq!(
            parse(&["--model", "my model", "stauts"]).err(),
            Some(clap::error::ErrorKind::InvalidSubcommand)
        );
    }
}
