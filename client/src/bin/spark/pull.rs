//! `spark pull`: fetch a model into the local model directory, with a progress bar on a
//! terminal.

use std::io::IsTerminal;
use std::process::ExitCode;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use spark_client::models::{self, PullProgress};

use crate::{exit, output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The model to fetch
    #[arg(default_value = models::DEFAULT_MODEL)]
    pub name: String,
}

/// Phases as spinner messages, bytes as a bar (stderr, terminals only).
struct BarProgress {
    bar: ProgressBar,
}

impl PullProgress for BarProgress {
    fn phase(&mut self, label: &str) {
        self.bar.set_message(label.to_string());
    }

    fn bytes(&mut self, done: u64, total: u64) {
        if self.bar.length() != Some(total) {
            self.bar.set_length(total);
            self.bar.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
        }
        self.bar.set_position(done);
    }
}

pub async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.name;
    // Downloading blocks; keep it off the runtime's thread.
    let path = tokio::task::spawn_blocking(move || {
        if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new_spinner();
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            let mut progress = BarProgress { bar };
            let result = models::pull(&name, &mut progress);
            progress.bar.finish_and_clear();
            result
        } else {
            models::pull(&name, &mut models::QuietProgress)
        }
    })
    .await
    .context("the download task failed")??;
    output::out_line(&path.display().to_string())?;
    Ok(exit::code(exit::OK))
}
