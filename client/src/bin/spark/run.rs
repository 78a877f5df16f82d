//! `spark run`: one prompt, streamed.

use std::{
    io::{self, IsTerminal, Read},
    process::ExitCode,
};

use anyhow::Context;
use spark_client::protocol::{PromptInput, ToolChatMessage};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    connect::{self, Autostart},
    exit::{self, Usage},
    format, output,
    request::RequestArgs,
    stream::{self, Mode},
    Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The prompt; read from stdin when absent or `-`
    pub prompt: Option<String>,
    #[command(flatten)]
    pub request: RequestArgs,
    /// Send the prompt as is, without the chat template, parsing special tokens
    #[arg(long, conflicts_with_all = ["system", "tools", "chat_template_kwargs"])]
    pub raw: bool,
    /// One JSON object per line per event, and no stats line
    #[arg(long)]
    pub json: bool,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let prompt = read_prompt(args.prompt.as_deref())?;
    let format = args.request.output_format()?;
    let tools = args.request.tool_set()?;
    let mut options = args.request.options()?;
    // From here on Ctrl-C is ours: it cancels instead of killing the process.
    let mut interrupts = signal(SignalKind::interrupt()).context("cannot catch Ctrl-C")?;
    let client = tokio::select! {
        client = connect::connect(global, Autostart::Allowed) => client?,
        _ = interrupts.recv() => return Ok(exit::code(exit::INTERRUPTED)),
    };

    let input = if args.raw {
        PromptInput::Raw {
            text: prompt,
            special: true,
        }
    } else {
        args.request
            .chat(&[ToolChatMessage::new("user", prompt)], tools.as_ref())
    };
    let request = args
        .request
        .request(client.next_request_id(), global.requested_model(), input);
    let mode = if args.json { Mode::Json } else { Mode::Text };
    stream::stream_calls(&mut options, mode, tools.is_some());
    let generation = client
        .generate_with(request, format.clone(), options)
        .await?;
    let outcome = stream::stream(generation, mode, &mut interrupts).await?;

    if let (Mode::Text, Some(done)) = (mode, &outcome.done) {
        output::dim_line(&format::stats_line(done, outcome.prefill.as_ref()));
    }
    Ok(exit::code(if outcome.interrupted {
        exit::INTERRUPTED
    } else {
        exit::OK
    }))
}

fn read_prompt(arg: Option<&str>) -> anyhow::Result<String> {
    let prompt = match arg {
        Some(prompt) if prompt != "-" => prompt.to_owned(),
        _ => {
            let mut stdin = io::stdin();
            if stdin.is_terminal() {
                output::error_line("reading the prompt from stdin (end it with Ctrl-D)");
            }
            let mut bytes = Vec::new();
            stdin
                .read_to_end(&mut bytes)
                .context("cannot read the prompt from stdin")?;
            String::from_utf8(bytes)
                .map_err(|_| Usage("the prompt on stdin is not UTF-8".into()))?
        }
    };
    if prompt.trim().is_empty() {
        return Err(Usage("the prompt is empty".into()).into());
    }
    Ok(prompt)
}
