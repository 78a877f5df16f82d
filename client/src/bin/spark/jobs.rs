//! `spark jobs`: recent generations.

use std::{
    process::ExitCode,
    time::{SystemTime, UNIX_EPOCH},
};

use crate::{
    connect::{self, Autostart},
    exit, format, json, output, Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many, newest first
    #[arg(long, default_value_t = 20)]
    pub limit: u32,
    /// One JSON object per job and line
    #[arg(long)]
    pub json: bool,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let client = connect::connect(global, Autostart::Never).await?;
    let jobs = client.job_entries(args.limit).await?;
    if args.json {
        for job in &jobs {
            output::out_line(&json::line(&json::Job::from(job)))?;
        }
    } else {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        output::out_line(&format::jobs_table(&jobs, now_ms))?;
        if jobs.iter().any(|job| job.record.estimated) {
            output::dim_line("~ estimated");
        }
    }
    Ok(exit::code(exit::OK))
}
