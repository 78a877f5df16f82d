//! Finds the tool calls in a generation's bytes as they are written.
//!
//! The watcher sits between the sampled tokens and the text stream. Text passes through,
//! except bytes that may begin an opening tag, held back until it is clear they do not.
//! Once a whole `<tool_call>` is written, the call's JSON is held to the call schema by
//! [`CallWatcher::constraint`] (the sampler masks with it), and its bytes are kept out
//! of the text; when the object closes it becomes a [`ToolCall`]. The closing tag and
//! the whitespace around it are dropped, then text (or another call) may follow. In the
//! Mistral syntax the tag is `[TOOL_CALLS]` and the JSON an array of calls, which ends
//! the answer; in Mistral's `[ARGS]` syntax the tag is followed by the call's header
//! (its name, maybe its id, then `[ARGS]`), held to the offered tools by
//! [`CallHeader`], then by the arguments, held to that tool's schema.
//!
//! A watcher made [`streaming`](CallWatcher::streaming) also gives each call in pieces
//! while it is written ([`CallDelta`]): an opening with the call's id and name as soon as
//! the name is whole, then the arguments' text as it grows, adding up to the finished
//! call's `arguments`. A call whose opening went out is never given back as text: if
//! the answer is cut short inside it, the pieces already sent are all there is of it.
//!
//! A thinking model's reasoning at the start of the answer (`<think>` ... `</think>`,
//! or from the first byte when the prompt opened it) is text in which no call is taken:
//! a tag the model mentions while thinking is not a call.

use spark_client::protocol::{ToolCall, ToolCallOpening};

use super::header::{CallHeader, HeaderCheck};
use super::scan::{CallScanner, ScannedCall};
use super::{CallGrammar, CallMode, CallSyntax, ToolSet, CALL_CLOSE};
use crate::text::constraint::JsonConstraint;
use crate::text::reasoning::ThinkTags;

/// What one token's bytes made of the answer.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Watched {
    /// Bytes of the answer's text.
    pub text: Vec<u8>,
    /// Calls completed by these bytes, in order.
    pub calls: Vec<ToolCall>,
    /// Pieces of calls being written (a streaming watcher's), in order, before the
    /// calls these bytes completed.
    pub deltas: Vec<CallDelta>,
    /// No more may be written: the generation ends here.
    pub end: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the answer's first bytes other than whitespace, which may open a thinking
    /// block: whitespace and a beginning of `<think>` are held.
    Leading,
    /// Inside the answer's thinking block, `matched` bytes of its closing tag seen:
    /// text, never a call.
    Thinking { matched: usize },
    /// The Llama syntax, before the answer's first byte other than whitespace (held):
    /// `{` makes the answer a call, anything else text.
    Start,
    /// Text; `held` bytes may begin an opening tag.
    Text,
    /// The `[ARGS]` syntax, after the opening tag: the call's header is constrained.
    Header,
    /// Inside a call, after its opening tag (or header): the JSON is constrained.
    Call,
    /// After a call's object: whitespace and the closing tag (`matched` bytes of it so
    /// far) are dropped.
    AfterCall { matched: usize },
    /// Nothing more is taken.
    Ended,
}

/// A piece of a call being written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallDelta {
    /// The call's index in the generation, as its [`ToolCall`] will have.
    pub index: u32,
    /// The call's id and name: in its first piece only.
    pub opening: Option<ToolCallOpening>,
    /// What follows of the arguments' text (whole characters).
    pub arguments: String,
}

/// What has gone out of one call of the JSON being written.
#[derive(Debug, Default)]
struct Streamed {
    /// Chosen when its opening goes out (or when it completes); in the `[ARGS]`
    /// syntax, the one the model wrote in the header.
    id: Option<String>,
    opened: bool,
    /// Bytes of the arguments sent.
    sent: usize,
}

/// One generation's tool calls.
#[derive(Debug)]
pub struct CallWatcher {
    tools: ToolSet,
    state: State,
    held: Vec<u8>,
    /// The current call's bytes: its opening tag as written (empty when the prompt
    /// wrote it), then its JSON.
    tag: Vec<u8>,
    json: Vec<u8>,
    constraint: Option<JsonConstraint>,
    /// The `[ARGS]` syntax: the header being written.
    header: Option<CallHeader>,
    /// The calls in the JSON being written, and what has gone out of each.
    scanner: Option<CallScanner>,
    streamed: Vec<Streamed>,
    /// Whether calls are given in pieces as they are written.
    stream: bool,
    calls: u32,
    think: ThinkTags,
}

/// What the next token must satisfy while a call is written.
pub enum CallConstraint<'a> {
    /// JSON: a call's object (or array), or its arguments.
    Json(&'a mut JsonConstraint),
    /// The header of a call in the `[ARGS]` syntax.
    Header(&'a CallHeader),
}

impl CallWatcher {
    /// `opens_thinking`: the prompt ends inside the model's thinking (see
    /// [`crate::text::reasoning::prompt_opens_thinking`]).
    pub fn new(tools: ToolSet, opens_thinking: bool, think: ThinkTags) -> Self {
        let mut watcher = Self {
            tools,
            state: State::Leading,
            held: Vec::new(),
            tag: Vec::new(),
            json: Vec::new(),
            constraint: None,
            header: None,
            scanner: None,
            streamed: Vec::new(),
            stream: false,
            calls: 0,
            think,
        };
        if watcher.tools.mode == CallMode::Forced {
            // The prompt ends with the opening tag (the Llama syntax has none): see
            // `CallSyntax::forced_prefix`.
            watcher.open_call();
        } else if opens_thinking {
            watcher.state = State::Thinking { matched: 0 };
        }
        watcher
    }

    /// Gives each call in pieces while it is written ([`Watched::deltas`]).
    pub fn streaming(mut self) -> Self {
        self.stream = true;
        self
    }

    /// Where the answer proper begins (after any thinking).
    fn answer_state(&self) -> State {
        match self.tools.syntax {
            CallSyntax::LlamaJson => State::Start,
            CallSyntax::Hermes | CallSyntax::Mistral | CallSyntax::MistralArgs { .. } => {
                State::Text
            }
        }
    }

    /// The constraint the next token must satisfy: set while a call is written.
    pub fn constraint(&mut self) -> Option<CallConstraint<'_>> {
        if let Some(header) = &self.header {
            return Some(CallConstraint::Header(header));
        }
        self.constraint.as_mut().map(CallConstraint::Json)
    }

    /// Whether the next token is free (no call is being written).
    pub fn is_free(&self) -> bool {
        self.constraint.is_none() && self.header.is_none()
    }

    /// The syntax the calls are written in.
    pub fn syntax(&self) -> CallSyntax {
        self.tools.syntax
    }

    /// How many calls have been made.
    pub fn calls(&self) -> u32 {
        self.calls
    }

    /// Takes one token's bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Watched {
        let mut out = Watched::default();
        for &b in bytes {
            self.byte(b, &mut out);
        }
        if self.state == State::Call {
            self.send_pieces(&mut out);
        }
        out.end = self.state == State::Ended;
        out
    }

    /// The generation ended (for any reason): bytes held back, and an unfinished call
    /// as the text it was, so nothing written is lost (unless its pieces went out).
    pub fn finish(&mut self) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.held);
        if matches!(self.state, State::Call | State::Header) {
            if !self.streamed.iter().any(|s| s.opened) {
                text.append(&mut self.tag);
                text.append(&mut self.json);
            }
            self.constraint = None;
            self.header = None;
            self.scanner = None;
            self.streamed.clear();
        }
        self.state = State::Ended;
        text
    }

    fn byte(&mut self, b: u8, out: &mut Watched) {
        match self.state {
            State::Ended => {}
            State::Leading => {
                self.held.push(b);
                let open = self.think.open.as_bytes();
                let rest = self.held.trim_ascii_start();
                if rest == open {
                    out.text.append(&mut self.held);
                    self.state = State::Thinking { matched: 0 };
                } else if !open.starts_with(rest) {
                    // No thinking: the held bytes begin the answer.
                    self.state = self.answer_state();
                    for b in std::mem::take(&mut self.held) {
                        self.byte(b, out);
                    }
                }
            }
            State::Thinking { matched } => {
                out.text.push(b);
                let close = self.think.close.as_bytes();
                self.state = if close[matched] == b && matched + 1 == close.len() {
                    self.answer_state()
                } else if close[matched] == b {
                    State::Thinking {
                        matched: matched + 1,
                    }
                } else {
                    // Each tag's first byte (`<`, `[`) is in it only once.
                    State::Thinking {
                        matched: usize::from(b == close[0]),
                    }
                };
            }
            State::Start if b.is_ascii_whitespace() => self.held.push(b),
            State::Start if b == b'{' => {
                self.tag = std::mem::take(&mut self.held);
                self.open_call();
                self.call_byte(b, out);
            }
            State::Start => {
                self.state = State::Text;
                out.text.append(&mut self.held);
                self.text_byte(b, out);
            }
            State::Text => self.text_byte(b, out),
            State::Header => self.header_byte(b, out),
            State::Call => self.call_byte(b, out),
            State::AfterCall { matched } => {
                let close = CALL_CLOSE.as_bytes();
                if matched < close.len() && close[matched] == b {
                    self.state = State::AfterCall {
                        matched: matched + 1,
                    };
                } else if (matched == 0 || matched == close.len()) && b.is_ascii_whitespace() {
                    // Around the closing tag.
                } else {
                    // Something else follows the call: text again.
                    self.state = State::Text;
                    self.text_byte(b, out);
                }
            }
        }
    }

    fn text_byte(&mut self, b: u8, out: &mut Watched) {
        let Some(open) = self.tools.syntax.open_tag() else {
            // A Llama answer is a call only from its start.
            out.text.push(b);
            return;
        };
        self.held.push(b);
        let open = open.as_bytes();
        if self.held == open {
            self.tag = std::mem::take(&mut self.held);
            self.open_call();
            return;
        }
        // Keep the shortest tail that may still begin the tag; the rest is text.
        let keep_from = (0..self.held.len())
            .find(|&k| open.starts_with(&self.held[k..]))
            .unwrap_or(self.held.len());
        out.text.extend(self.held.drain(..keep_from));
    }

    fn header_byte(&mut self, b: u8, out: &mut Watched) {
        let Some(header) = &mut self.header else {
            return;
        };
        self.tag.push(b);
        match header.accept(&[b]) {
            HeaderCheck::Partial => {}
            // Only bytes no mask checked can be refused (see `call_byte`).
            HeaderCheck::Invalid => out.text.extend(self.finish_as_text()),
            HeaderCheck::Done { tool, id } => {
                self.header = None;
                // A header is only watched for under `Headed` (see `open_call`).
                let CallGrammar::Headed { names, arguments } = &self.tools.grammar else {
                    out.text.extend(self.finish_as_text());
                    return;
                };
                self.scanner = Some(CallScanner::new(
                    self.tools.syntax,
                    Some(names[tool].clone()),
                ));
                self.streamed = vec![Streamed {
                    id,
                    ..Streamed::default()
                }];
                self.json.clear();
                self.constraint = Some(JsonConstraint::after_whitespace(arguments[tool].clone()));
                self.state = State::Call;
            }
        }
    }

    /// What follows the opening tag: the call's header in the `[ARGS]` syntax, its
    /// JSON in the others.
    fn open_call(&mut self) {
        self.json.clear();
        self.streamed.clear();
        match &self.tools.grammar {
            CallGrammar::Headed { names, .. } => {
                let call_ids = matches!(
                    self.tools.syntax,
                    CallSyntax::MistralArgs { call_ids: true }
                );
                self.header = Some(CallHeader::new(names.clone(), call_ids));
                self.state = State::Header;
            }
            CallGrammar::Json(schema) => {
                let schema = schema.clone();
                self.constraint = Some(match self.tools.syntax {
                    CallSyntax::Mistral => JsonConstraint::array_after_whitespace(schema),
                    _ => JsonConstraint::after_whitespace(schema),
                });
                self.scanner = Some(CallScanner::new(self.tools.syntax, None));
                self.state = State::Call;
            }
        }
    }

    fn call_byte(&mut self, b: u8, out: &mut Watched) {
        let Some(constraint) = &mut self.constraint else {
            return;
        };
        self.json.push(b);
        if !constraint.accept(&[b]) {
            // Only bytes written before the constraint took over (the rest of the
            // token that ended the tag) can be refused: this was no call after all.
            out.text.extend(self.finish_as_text());
            return;
        }
        let done = constraint.is_done();
        if let Some(scanner) = &mut self.scanner {
            scanner.push(b);
        }
        if !done {
            return;
        }
        self.constraint = None;
        self.send_pieces(out);
        let syntax = self.tools.syntax;
        match self.take_calls() {
            Some(calls) => {
                self.calls += calls.len() as u32;
                out.calls.extend(calls);
                self.tag.clear();
                self.json.clear();
                // A forced answer is one call and no text, and a Mistral answer's array
                // holds all its calls; otherwise more calls (or text) may follow when
                // parallel calls are allowed.
                let more = self.tools.parallel
                    && self.tools.mode == CallMode::Auto
                    && syntax != CallSyntax::Mistral;
                self.state = match syntax {
                    CallSyntax::Hermes if more => State::AfterCall { matched: 0 },
                    // The next call opens with its own tag.
                    CallSyntax::MistralArgs { .. } if more => State::Text,
                    _ => State::Ended,
                };
            }
            None => out.text.extend(self.finish_as_text()),
        }
    }

    /// A streaming watcher's pieces of the calls being written: each call's opening
    /// once its name is whole, then what its arguments gained (whole characters; the
    /// rest of one split by a token waits for the next).
    fn send_pieces(&mut self, out: &mut Watched) {
        let Some(scanner) = &self.scanner else {
            return;
        };
        if !self.stream {
            return;
        }
        let syntax = self.tools.syntax;
        for (i, call) in scanner.calls().iter().enumerate() {
            if self.streamed.len() <= i {
                self.streamed.push(Streamed::default());
            }
            let streamed = &mut self.streamed[i];
            let Some(name) = &call.name else {
                // The arguments wait for the name, which may come after them.
                continue;
            };
            let opening = (!streamed.opened).then(|| {
                streamed.opened = true;
                ToolCallOpening {
                    id: streamed
                        .id
                        .get_or_insert_with(|| syntax.new_call_id())
                        .clone(),
                    name: name.clone(),
                }
            });
            let unsent = &call.arguments[streamed.sent..];
            let whole = match std::str::from_utf8(unsent) {
                Ok(_) => unsent.len(),
                Err(e) => e.valid_up_to(),
            };
            streamed.sent += whole;
            let arguments = String::from_utf8_lossy(&unsent[..whole]).into_owned();
            if opening.is_some() || !arguments.is_empty() {
                out.deltas.push(CallDelta {
                    index: self.calls + i as u32,
                    opening,
                    arguments,
                });
            }
        }
    }

    /// The calls of the JSON just completed, with the ids their openings gave them.
    fn take_calls(&mut self) -> Option<Vec<ToolCall>> {
        let scanner = self.scanner.take()?;
        let mut ids = std::mem::take(&mut self.streamed).into_iter().map(|s| s.id);
        let syntax = self.tools.syntax;
        let calls: Option<Vec<ToolCall>> = scanner
            .into_calls()
            .into_iter()
            .map(|call| complete_call(call, ids.next().flatten(), syntax))
            .collect();
        calls.filter(|c| !c.is_empty())
    }

    /// The current call's bytes, given back as text; the watcher reads text again.
    fn finish_as_text(&mut self) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.tag);
        text.append(&mut self.json);
        self.constraint = None;
        self.header = None;
        self.scanner = None;
        self.streamed.clear();
        self.state = State::Text;
        text
    }
}

/// A call whose JSON is complete: its name, and its arguments' object as written (the
/// constraint held it to the schema; this only refuses what could never be a call).
fn complete_call(call: ScannedCall, id: Option<String>, syntax: CallSyntax) -> Option<ToolCall> {
    let name = call.name.filter(|_| call.closed)?;
    let arguments = String::from_utf8(call.arguments).ok()?;
    let value: serde_json::Value = serde_json::from_str(&arguments).ok()?;
    value.is_object().then(|| ToolCall {
        id: id.unwrap_or_else(|| syntax.new_call_id()),
        name,
        arguments,
    })
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
