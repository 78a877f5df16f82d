//! `spark tokenize`: the loaded model's tokens for a text.

use std::{
    io::{self, Read},
    process::ExitCode,
};

use anyhow::Context;

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
