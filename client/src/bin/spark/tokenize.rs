//! `spark tokenize`: the loaded model's tokens for a text.

use std::{
    io::{self, Read},
    path::Path,
    process::ExitCode,
};

use anyhow::Context;
use spark_client::{models, protocol::ErrorKind, ClientError};

use crate::{
    connect::{self, Autostart},
    exit, output, Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The text; `-` reads stdin
    pub text: String,
    /// Parse special-token text such as `<|im_start|>` into special tokens
    #[arg(long)]
    pub special: bool,
    /// The token ids as a JSON array
    #[arg(long)]
    pub json: bool,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let text = if args.text == "-" {
        let mut text = String::new();
        io::stdin()
            .read_to_string(&mut text)
            .context("cannot read stdin")?;
        text
    } else {
        args.text
    };
    let client = connect::connect(global, Autostart::Never).await?;
    // Tokenize requests name no model: check the one asked for here, as a generation
    // would be checked by the daemon, rather than answer with another model's tokens.
    if let Some(asked) = global.requested_model() {
        let loaded = client.status().await?.model;
        if !models::names_model(&asked, &loaded.name, Path::new(&loaded.path)) {
            return Err(ClientError::InvalidRequest {
                kind: ErrorKind::UnknownModel,
                message: format!(
                    "model `{asked}` is not loaded (this daemon serves `{}`)",
                    loaded.name
                ),
            }
            .into());
        }
    }
    let tokens = client.tokenize(&text, args.special).await?;
    if args.json {
        let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
        output::out_line(&serde_json::to_string(&ids)?)?;
    } else {
        let width = tokens
            .iter()
            .map(|t| t.id.to_string().len())
            .max()
            .unwrap_or(1);
        for token in &tokens {
            // Debug formatting shows spaces, newlines and control bytes unambiguously.
            output::out_line(&format!("{:>width$}  {:?}", token.id, token.piece))?;
        }
        output::dim_line(&format!("{} tokens", tokens.len()));
    }
    Ok(exit::code(exit::OK))
}
