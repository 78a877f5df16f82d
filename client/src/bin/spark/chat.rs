//! `spark chat`: a conversation, kept on the client side and sent whole each turn.

use std::{
    io::{self, BufRead, IsTerminal},
    process::ExitCode,
};

use anyhow::Context;
use spark_client::{
    protocol::{ErrorKind, ToolCall, ToolChatMessage},
    ClientError,
};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};

use crate::{
    connect::{self, Autostart},
    exit, format, output,
    request::RequestArgs,
    stream::{self, Mode},
    Global,
};

#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub request: RequestArgs,
}

pub async fn run(global: &Global, args: Args) -> anyhow::Result<ExitCode> {
    let format = args.request.output_format()?;
    let tools = args.request.tool_set()?;
    let mut options = args.request.options()?;
    let mut interrupts = signal(SignalKind::interrupt()).context("cannot catch Ctrl-C")?;
    let client = tokio::select! {
        client = connect::connect(global, Autostart::Allowed) => client?,
        _ = interrupts.recv() => return Ok(exit::code(exit::INTERRUPTED)),
    };
    stream::stream_calls(&mut options, Mode::Text, tools.is_some());
    let interactive = io::stdin().is_terminal();
    let mut lines = stdin_lines();
    let mut turns: Vec<ToolChatMessage> = Vec::new();
    // A question refused on the way (a script's): the exit status says so at the end.
    let mut refused = false;
    if interactive {
        output::dim_line(
            "Ctrl-C stops an answer; /clear forgets the conversation; Ctrl-D or /exit leaves.",
        );
    }

    loop {
        if interactive {
            output::err_text(">>> ");
        }
        let line = tokio::select! {
            line = lines.recv() => line,
            _ = interrupts.recv() => {
                // The terminal discarded the half-typed line; start a fresh one.
                output::err_text("\n");
                continue;
            }
        };
        let line = match line {
            None => {
                // Ctrl-D left the cursor after the prompt.
                if interactive {
                    output::err_text("\n");
                }
                break;
            }
            Some(line) => line.context("cannot read stdin")?,
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/exit" || text == "/quit" {
            break;
        }
        if text == "/clear" {
            turns.clear();
            output::dim_line("(conversation cleared)");
            continue;
        }

        turns.push(ToolChatMessage::new("user", text));
        let answer = loop {
            let request = args.request.request(
                client.next_request_id(),
                global.requested_model(),
                args.request.chat(&turns, tools.as_ref()),
            );
            let answer = match client
                .generate_with(request, format.clone(), options.clone())
                .await
            {
                Ok(generation) => stream::stream(generation, Mode::Text, &mut interrupts).await,
                Err(err) => Err(err.into()),
            };
            // Too long for the model's context: the oldest exchange goes (the system
            // message stays), as long as there is one before this question.
            if turns.len() > 2 && error_kind(&answer) == Some(ErrorKind::ContextOverflow) {
                turns.drain(..2);
                output::dim_line(&match args.request.max_tokens {
                    // The room kept for the answer may be what does not fit.
                    Some(n) => format!(
                        "(the conversation, with room for --max-tokens {n}, outgrew the \
                         context: its oldest exchange is left out)"
                    ),
                    None => "(the conversation outgrew the context: its oldest exchange is \
                             left out)"
                        .to_string(),
                });
                continue;
            }
            break answer;
        };
        match answer {
            Ok(outcome) => {
                if let Some(done) = &outcome.done {
                    output::dim_line(&format::stats_line(done, outcome.prefill.as_ref()));
                }
                // A stopped answer stays in the history as far as it went: it was seen.
                turns.push(assistant_turn(outcome.text, outcome.calls));
            }
            Err(err) => match err.downcast_ref::<ClientError>() {
                // Another model loaded: no later turn would fare better.
                Some(client_err) if client_err.kind() == Some(ErrorKind::UnknownModel) => {
                    return Err(err)
                }
                // Refused (busy, too long...): say so and let the user go on.
                Some(client_err) if !client_err.is_unavailable() => {
                    turns.pop();
                    refused = true;
                    output::error_line(&format!("spark: {client_err}"));
                    if client_err.kind() == Some(ErrorKind::ContextOverflow) {
                        // Nothing older is left to drop: the question itself, or the room
                        // kept for the answer, is too long.
                        output::error_line(&match args.request.max_tokens {
                            Some(n) => format!(
                                "hint: a shorter question, or a lower --max-tokens ({n} \
                                 tokens are kept for the answer)"
                            ),
                            None => "hint: a shorter question".to_string(),
                        });
                    }
                }
                _ => return Err(err),
            },
        }
    }
    Ok(exit::code(if refused && !interactive {
        exit::REQUEST_FAILED
    } else {
        exit::OK
    }))
}

/// An answer as the history keeps it: its text and the calls it made. No one answers
/// the calls (there is no tool to run here), but the next turn shows the model it made
/// them, as a client that runs tools would.
fn assistant_turn(text: String, calls: Vec<ToolCall>) -> ToolChatMessage {
    ToolChatMessage {
        // An answer that is only calls has no content, as in OpenAI's history.
        content: (!text.is_empty() || calls.is_empty()).then_some(text),
        tool_calls: calls,
        ..ToolChatMessage::new("assistant", "")
    }
}

/// What the daemon said of a refused request.
fn error_kind<T>(answer: &anyhow::Result<T>) -> Option<ErrorKind> {
    answer
        .as_ref()
        .err()?
        .downcast_ref::<ClientError>()
        .and_then(ClientError::kind)
}

/// Lines of stdin, read on a thread of their own (a blocking read cannot be cancelled,
/// and the process may end while it waits).
fn stdin_lines() -> mpsc::UnboundedReceiver<io::Result<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let mut stdin = io::stdin().lock();
        loop {
            let mut bytes = Vec::new();
            match stdin.read_until(b'\n', &mut bytes) {
                Ok(0) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&bytes).into_owned();
                    if tx.send(Ok(line)).is_err() {
                        break;
                    }
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                Err(err) => {
                    let _ = tx.send(Err(err));
                    break;
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_keep_their_calls_in_the_history() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let only_calls = assistant_turn(String::new(), vec![call.clone()]);
        assert_eq!(only_calls.role, "assistant");
        assert_eq!(only_calls.content, None);
        assert_eq!(only_calls.tool_calls, std::slice::from_ref(&call));
        let both = assistant_turn("Let me look.".into(), vec![call]);
        assert_eq!(both.content.as_deref(), Some("Let me look."));
        assert_eq!(both.tool_calls.len(), 1);
        // A plain (even empty) answer stays a plain turn.
        assert_eq!(
            assistant_turn(String::new(), Vec::new()),
            ToolChatMessage::new("assistant", "")
        );
    }
}
