//! `spark pull`: fetch a model into the local model directory.

use std::process::ExitCode;

use anyhow::Context;
use spark_client::models::{self, PullProgress, QuietProgress};

use crate::{exit, format, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model to fetch
    #[arg(default_value = models::DEFAULT_MODEL)]
    pub name: String,
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.name;
    let terminal = output::stderr_is_tty();
    // Downloading blocks; keep it off the runtime's thread.
    let path = tokio::task::spawn_blocking(move || {
        if terminal {
            models::pull(&name, &mut TerminalProgress::default())
        } else {
            models::pull(&name, &mut QuietProgress)
        }
    })
    .await
    .context("the download task failed")??;
    output::out_line(&path.display().to_string())?;
    Ok(exit::code(exit::OK))
}

/// Phases on lines of their own, byte counts redrawn in place on the last line.
#[derive(Default)]
struct TerminalProgress {
    counting: bool,
}

impl PullProgress for TerminalProgress {
    fn phase(&mut self, label: &str) {
        if self.counting {
            output::err_text("\n");
            self.counting = false;
        }
        output::error_line(label);
    }

    fn bytes(&mut self, done: u64, total: u64) {
        let percent = done.saturating_mul(100).checked_div(total).unwrap_or(0);
        output::err_text(&format!(
            "\r\x1b[2K{} / {} ({percent}%)",
            format::mib(done),
            format::mib(total)
        ));
        self.counting = true;
    }
}

impl Drop for TerminalProgress {
    fn drop(&mut self) {
        if self.counting {
            output::err_text("\n");
        }
    }
}
