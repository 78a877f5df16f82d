//! `spark status`: what the daemon is running and how loaded it is.

use std::process::ExitCode;

use crate::{
    connect::{self, Autostart},
    exit, format, output, Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The daemon's report as one JSON object
    #[arg(long)]
    pub json: bool,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let client = connect::connect(global, Autostart::Never).await?;
    let status = client.status().await?;
    if args.json {
        output::out_line(&serde_json::to_string_pretty(&status)?)?;
    } else {
        output::out_line(&format::status_text(&status))?;
    }
    Ok(exit::code(exit::OK))
}
