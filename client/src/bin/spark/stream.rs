//! Streaming one generation to stdout, with Ctrl-C handling shared by `run` and `chat`.

use futures::StreamExt;
use spark_client::{
    protocol::{DoneEvent, PrefillEvent},
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
    /// `None` only when a second Ctrl-C abandoned the generation before its end.
    pub done: Option<DoneEvent>,
    /// How the prompt was read; `None` before the first token or from a daemon older
    /// than protocol 1.2.
    pub prefill: Option<PrefillEvent>,
    /// Ctrl-C was pressed.
    pub interrupted: bool,
}

/// Streams `generation` to its end. The first Ctrl-C asks the daemon to cancel and
/// waits for the `Done`; a second one stops waiting (dropping the stream cancels too).
pub async fn stream(
    mut generation: Generation,
    mode: Mode,
    interrupts: &mut Signal,
) -> anyhow::Result<Outcome> {
    let mut outcome = Outcome::default();
    let terminal = output::stdout_is_tty();
    loop {
        let event = tokio::select! {
            event = generation.next() => event,
            _ = interrupts.recv() => {
                if outcome.interrupted {
                    if mode == Mode::Text {
                        end_line(&outcome.text)?;
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
            Some(Ok(GenerationEvent::Token(token))) => {
                match mode {
                    Mode::Text if terminal => output::out(&output::terminal_safe(&token.text))?,
                    Mode::Text => output::out(&token.text)?,
                    Mode::Json => output::out_line(&json::line(&json::Event::token(&token)))?,
                }
                outcome.text.push_str(&token.text);
            }
            Some(Ok(GenerationEvent::Done(done))) => {
                match mode {
                    Mode::Text => end_line(&outcome.text)?,
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
                    Mode::Text => end_line(&outcome.text)?,
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

/// Ends stdout's last line after an answer that did not, so that what follows (the stats
/// line, an error, the next prompt) starts on a line of its own.
fn end_line(text: &str) -> std::io::Result<()> {
    if text.is_empty() || text.ends_with('\n') {
        Ok(())
    } else {
        output::out("\n")
    }
}
