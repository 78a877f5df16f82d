//! Streaming one generation to stdout, with Ctrl-C handling shared by `run` and `chat`.

use futures::StreamExt;
use spark_client::{
    protocol::{DoneEvent, GenerateOption, PrefillEvent, ToolCall},
    ClientError, Generation, GenerationEvent,
};
use tokio::signal::unix::Signal;

use crate::{json, output};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The text as it comes.
    Text,
    /// One JSON object per event.
    Json,
}

#[derive(Debug, Default)]
pub struct Outcome {
    /// Everything generated, as shown.
    pub text: String,
    /// The functions the model called (`--tools`), in order.
    pub calls: Vec<ToolCall>,
    /// `None` only when a second Ctrl-C abandoned the generation before its end.
    pub done: Option<DoneEvent>,
    /// How the prompt was read; `None` before the first token or from a daemon older
    /// than protocol 1.2.
    pub prefill: Option<PrefillEvent>,
    /// Ctrl-C was pressed.
    pub interrupted: bool,
}

/// Asks for a request's calls in pieces (`StreamToolCalls`) where `mode` shows them as
/// they are written: text, with tools offered (a daemon older than 1.9 is not asked,
/// see `Client::generate_with`). `--json` keeps one event per whole call.
pub fn stream_calls(options: &mut Vec<GenerateOption>, mode: Mode, tools: bool) {
    if mode == Mode::Text && tools {
        options.push(GenerateOption::StreamToolCalls);
    }
}

/// Streams `generation` to its end. The first Ctrl-C asks the daemon to cancel and
/// waits for the `Done`; a second one stops waiting (dropping the stream cancels too).
/// A call streamed in pieces is shown as it is written: `name(` and its arguments, the
/// `)` once it is complete.
pub async fn stream(
    mut generation: Generation,
    mode: Mode,
    interrupts: &mut Signal,
) -> anyhow::Result<Outcome> {
    let mut outcome = Outcome::default();
    let terminal = output::stdout_is_tty();
    // Text was shown since the last newline: what comes next needs a line of its own.
    let mut line_open = false;
    // Reasoning went to stderr since the last newline there.
    let mut reasoning_open = false;
    // The index of the call being shown in pieces, its line open.
    let mut call_open: Option<u32> = None;
    loop {
        let event = tokio::select! {
            event = generation.next() => event,
            _ = interrupts.recv() => {
                if outcome.interrupted {
                    if mode == Mode::Text {
                        end_line(line_open)?;
                    }
                    return Ok(outcome);
                }
                outcome.interrupted = true;
                generation.cancel()?;
                continue;
            }
        };
        match event {
            Some(Ok(GenerationEvent::Prefilled(prefill))) => outcome.prefill = Some(prefill),
            // `spark` asks for no logprobs.
            Some(Ok(GenerationEvent::TokenBytes(_))) => {}
            // Only asked for in text mode (see `stream_calls`).
            Some(Ok(GenerationEvent::ToolCallDelta(delta))) => {
                let mut shown = String::new();
                if let Some(opening) = &delta.opening {
                    end_line(line_open)?;
                    call_open = Some(delta.index);
                    line_open = true;
                    shown = format!("{}(", opening.name);
                }
                if call_open == Some(delta.index) {
                    shown.push_str(&one_line(&delta.arguments));
                    if terminal {
                        output::out(&output::terminal_safe(&shown))?;
                    } else {
                        output::out(&shown)?;
                    }
                }
            }
            Some(Ok(GenerationEvent::Reasoning(event))) => match mode {
                Mode::Text => {
                    output::err_dim_text(&event.text);
                    if !event.text.is_empty() {
                        reasoning_open = !event.text.ends_with('\n');
                    }
                }
                Mode::Json => output::out_line(&json::line(&json::Event::reasoning(&event)))?,
            },
            Some(Ok(GenerationEvent::Token(token))) => {
                if reasoning_open && !token.text.is_empty() {
                    // The answer starts on a line of its own after the reasoning.
                    output::err_text("\n");
                    reasoning_open = false;
                }
                match mode {
                    Mode::Text if terminal => output::out(&output::terminal_safe(&token.text))?,
                    Mode::Text => output::out(&token.text)?,
                    Mode::Json => output::out_line(&json::line(&json::Event::token(&token)))?,
                }
                if !token.text.is_empty() {
                    line_open = !token.text.ends_with('\n');
                }
                outcome.text.push_str(&token.text);
            }
            Some(Ok(GenerationEvent::ToolCall(event))) => {
                match mode {
                    Mode::Text if call_open == Some(event.index) => {
                        // Shown while it was written: only its end is left.
                        call_open = None;
                        line_open = false;
                        output::out_line(")")?;
                    }
                    Mode::Text => {
                        end_line(line_open)?;
                        line_open = false;
                        let line = call_line(&event.call);
                        if terminal {
                            output::out_line(&output::terminal_safe(&line))?;
                        } else {
                            output::out_line(&line)?;
                        }
                    }
                    Mode::Json => output::out_line(&json::line(&json::Event::tool_call(&event)))?,
                }
                outcome.calls.push(event.call);
            }
            Some(Ok(GenerationEvent::Done(done))) => {
                if reasoning_open {
                    output::err_text("\n");
                }
                match mode {
                    Mode::Text => {
                        end_line(line_open)?;
                        if call_open.is_some() {
                            output::dim_line("(the call was cut short)");
                        }
                    }
                    Mode::Json => output::out_line(&json::line(&json::Event::done(
                        &done,
                        outcome.prefill.as_ref(),
                    )))?,
                }
                outcome.done = Some(done);
                return Ok(outcome);
            }
            Some(Err(err)) => {
                match mode {
                    // Keep the error message off the line of a half-written answer.
                    Mode::Text => end_line(line_open)?,
                    Mode::Json => output::out_line(&json::line(&json::Event::error(
                        Some(generation.id()),
                        &err,
                    )))?,
                }
                return Err(err.into());
            }
            // The stream always yields a final item before it ends.
            None => return Err(ClientError::Disconnected.into()),
        }
    }
}

/// Ends stdout's last line when the text shown left it open, so that what follows (a
/// call, the stats line, an error, the next prompt) starts on a line of its own.
fn end_line(line_open: bool) -> std::io::Result<()> {
    if line_open {
        output::out("\n")
    } else {
        Ok(())
    }
}

/// A call as `spark` prints it: `name(arguments)`, the arguments as the JSON text the
/// daemon sent, on one line. A raw line break in JSON text can only be whitespace
/// between tokens (inside strings it is escaped), so a space keeps the meaning.
fn call_line(call: &ToolCall) -> String {
    format!("{}({})", call.name, one_line(&call.arguments))
}

/// JSON text on one line (see [`call_line`]).
fn one_line(json: &str) -> String {
    json.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_print_as_name_and_arguments() {
        let call = ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Oslo"}"#.into(),
        };
        assert_eq!(call_line(&call), r#"get_weather({"city":"Oslo"})"#);
        let spread = ToolCall {
            arguments: "{\n  \"city\": \"a\\nb\"\r\n}".into(),
            ..call
        };
        assert_eq!(call_line(&spread), r#"get_weather({   "city": "a\nb"  })"#);
    }
}
