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
//! A thinking model's reasoning at the start of the answer (`<think>` ... `</think>`,
//! or from the first byte when the prompt opened it) is text in which no call is taken:
//! a tag the model mentions while thinking is not a call.

use spark_client::protocol::ToolCall;

use super::header::{CallHeader, HeaderCheck};
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
    /// The `[ARGS]` syntax: the header being written, then the name and id it gave the
    /// call whose arguments are being written.
    header: Option<CallHeader>,
    named: Option<(String, Option<String>)>,
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
            named: None,
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
        out.end = self.state == State::Ended;
        out
    }

    /// The generation ended (for any reason): bytes held back, and an unfinished call
    /// as the text it was, so nothing written is lost.
    pub fn finish(&mut self) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.held);
        if matches!(self.state, State::Call | State::Header) {
            text.append(&mut self.tag);
            text.append(&mut self.json);
            self.constraint = None;
            self.header = None;
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
                self.named = Some((names[tool].clone(), id));
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
        if !constraint.is_done() {
            return;
        }
        self.constraint = None;
        let syntax = self.tools.syntax;
        let calls = match syntax {
            CallSyntax::Mistral => parse_call_list(&self.json, syntax),
            CallSyntax::MistralArgs { .. } => self
                .named
                .take()
                .and_then(|(name, id)| named_call(&self.json, name, id, syntax))
                .map(|call| vec![call]),
            _ => parse_call(&self.json, syntax).map(|call| vec![call]),
        };
        match calls {
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

    /// The current call's bytes, given back as text; the watcher reads text again.
    fn finish_as_text(&mut self) -> Vec<u8> {
        let mut text = std::mem::take(&mut self.tag);
        text.append(&mut self.json);
        self.constraint = None;
        self.header = None;
        self.named = None;
        self.state = State::Text;
        text
    }
}

/// A complete call object: its tool's name and its arguments (under the syntax's
/// key; compact JSON, in the order written).
fn parse_call(json: &[u8], syntax: CallSyntax) -> Option<ToolCall> {
    call_of(&serde_json::from_slice(json).ok()?, syntax)
}

/// A complete array of call objects (the Mistral syntax).
fn parse_call_list(json: &[u8], syntax: CallSyntax) -> Option<Vec<ToolCall>> {
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    let calls: Option<Vec<ToolCall>> = value
        .as_array()?
        .iter()
        .map(|call| call_of(call, syntax))
        .collect();
    calls.filter(|c| !c.is_empty())
}

/// A call in the `[ARGS]` syntax: the header's name and id (a new one when the model
/// wrote none), and the arguments' complete object.
fn named_call(
    json: &[u8],
    name: String,
    id: Option<String>,
    syntax: CallSyntax,
) -> Option<ToolCall> {
    let arguments: serde_json::Value = serde_json::from_slice(json).ok()?;
    arguments.is_object().then(|| ToolCall {
        id: id.unwrap_or_else(|| syntax.new_call_id()),
        name,
        arguments: arguments.to_string(),
    })
}

fn call_of(value: &serde_json::Value, syntax: CallSyntax) -> Option<ToolCall> {
    let name = value.get("name")?.as_str()?.to_string();
    let arguments = value
        .get(syntax.arguments_key())
        .filter(|a| a.is_object())?;
    Some(ToolCall {
        id: syntax.new_call_id(),
        name,
        arguments: arguments.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use spark_client::protocol::{ToolChoice, ToolSpec};

    fn tools(choice: ToolChoice, parallel: bool) -> ToolSet {
        tools_in(CallSyntax::Hermes, choice, parallel)
    }

    fn tools_in(syntax: CallSyntax, choice: ToolChoice, parallel: bool) -> ToolSet {
        let weather = ToolSpec {
            name: "get_weather".into(),
            description: "Weather in a city".into(),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            })
            .to_string(),
            strict: false,
        };
        let time = ToolSpec {
            name: "get_time".into(),
            description: String::new(),
            parameters: String::new(),
            strict: false,
        };
        ToolSet::prepare(&[weather, time], &choice, parallel, syntax)
            .unwrap()
            .unwrap()
    }

    /// The JSON constraint of the call being written.
    fn json_of(w: &mut CallWatcher) -> &mut JsonConstraint {
        match w.constraint() {
            Some(CallConstraint::Json(c)) => c,
            _ => panic!("no call's JSON is being written"),
        }
    }

    /// Feeds `text` in pieces of `step` bytes; the text, the calls and whether it ended.
    fn run(watcher: &mut CallWatcher, text: &str, step: usize) -> (String, Vec<ToolCall>, bool) {
        let (mut bytes, mut calls, mut end) = (Vec::new(), Vec::new(), false);
        for piece in text.as_bytes().chunks(step) {
            let w = watcher.push(piece);
            bytes.extend(w.text);
            calls.extend(w.calls);
            end |= w.end;
        }
        if !end {
            bytes.extend(watcher.finish());
        }
        (String::from_utf8(bytes).unwrap(), calls, end)
    }

    #[test]
    fn text_without_calls_passes_through_whole() {
        for step in [1, 3, 64] {
            let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
            let text = "a < b, <tool and <tool_cal> are not tags; x<";
            let (out, calls, end) = run(&mut w, text, step);
            assert_eq!(out, text);
            assert!(calls.is_empty() && !end);
        }
    }

    #[test]
    fn calls_are_taken_out_of_the_text_at_any_token_split() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        for step in 1..=12 {
            let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
            let (out, calls, end) = run(&mut w, text, step);
            assert_eq!(out, "Let me check.\n", "step {step}");
            assert!(!end);
            assert_eq!(calls.len(), 2);
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
            assert_eq!(calls[1].name, "get_time");
            assert_eq!(calls[1].arguments, "{}");
            assert!(calls[0].id.starts_with("call_") && calls[0].id.len() == 29);
            assert_ne!(calls[0].id, calls[1].id);
        }
    }

    #[test]
    fn the_constraint_holds_only_while_a_call_is_written() {
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        assert!(w.is_free());
        w.push(b"Hi <tool_");
        assert!(w.is_free());
        w.push(b"call>");
        assert!(!w.is_free(), "armed once the tag is whole");
        w.push(br#"{"name": "get_time", "arguments": {}"#);
        assert!(!w.is_free());
        let done = w.push(b"}");
        assert_eq!(done.calls.len(), 1);
        assert!(w.is_free());
    }

    #[test]
    fn a_forced_call_starts_at_once_and_ends_the_answer() {
        let mut w = CallWatcher::new(tools(ToolChoice::Required, true), false, ThinkTags::XML);
        assert!(!w.is_free(), "the prompt wrote the tag");
        let (out, calls, end) = run(
            &mut w,
            "\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
            5,
        );
        assert!(end);
        assert_eq!(out, "");
        assert_eq!(calls.len(), 1);
    }

    #[test]
    fn a_call_that_is_cut_short_is_given_back_as_text() {
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"argu";
        let (out, calls, _) = run(&mut w, text, 4);
        assert_eq!(out, text);
        assert!(calls.is_empty());
    }

    #[test]
    fn a_tag_followed_by_what_no_call_begins_with_is_text() {
        // The rest of the tag's token is refused by the call schema: no call.
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let (out, calls, _) = run(&mut w, "<tool_call>oops, a tag", 64);
        assert_eq!(out, "<tool_call>oops, a tag");
        assert!(calls.is_empty());
    }

    #[test]
    fn a_llama_answer_that_begins_with_a_brace_is_one_call() {
        let text = "\n {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        for step in [1, 2, 5, 64] {
            let mut w = CallWatcher::new(
                tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
                false,
                ThinkTags::XML,
            );
            assert!(
                w.is_free(),
                "free until the first byte that is not whitespace"
            );
            let (out, calls, end) = run(&mut w, text, step);
            assert_eq!(out, "", "step {step}");
            assert!(end, "one call is the whole answer");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
        }
    }

    #[test]
    fn a_llama_answer_that_begins_otherwise_is_text_to_the_end() {
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let text = "  It is {\"name\": \"get_time\", \"parameters\": {}} <tool_call>";
        let (out, calls, end) = run(&mut w, text, 3);
        assert_eq!(out, text);
        assert!(calls.is_empty() && !end);
        // Held to the call schema once it begins: `arguments` is not the Llama key.
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        w.push(b"{");
        let c = json_of(&mut w);
        assert!(c.accept(br#""name": "get_time", "#));
        assert!(!c.clone().accept(br#""arguments""#));
        assert!(c.accept(br#""parameters": {}}"#));
    }

    #[test]
    fn a_forced_llama_call_is_held_from_the_first_token() {
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::LlamaJson, ToolChoice::Required, true),
            false,
            ThinkTags::XML,
        );
        assert!(!w.is_free(), "no tag: the answer is the call");
        let (out, calls, end) = run(&mut w, "{\"name\": \"get_time\", \"parameters\": {}}", 4);
        assert!(end && out.is_empty());
        assert_eq!(calls.len(), 1);
        // Cut short: given back as the text it was.
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let text = " {\"name\": \"get_weather\", \"param";
        let (out, calls, _) = run(&mut w, text, 4);
        assert_eq!(out, text);
        assert!(calls.is_empty());
    }

    #[test]
    fn calls_are_held_to_the_offered_tools() {
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        w.push(b"<tool_call>");
        let c = json_of(&mut w);
        assert!(c.accept(br#"{"name": "get_"#));
        let mut refused = c.clone();
        assert!(!refused.accept(b"x"), "no tool is named get_x");
        let mut missing_city = c.clone();
        assert!(missing_city.accept(br#"weather", "arguments": {"#));
        assert!(!missing_city.accept(b"}"), "city is required");
    }

    #[test]
    fn no_call_is_taken_inside_the_answers_thinking() {
        let call = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
        let thinking = "<think>\nI could write <tool_call> here.\n</think>\n\n";
        for step in 1..=9 {
            let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
            let (out, calls, _) = run(&mut w, &format!("  {thinking}{call}"), step);
            assert_eq!(out, format!("  {thinking}"), "step {step}");
            assert_eq!(calls.len(), 1, "step {step}");
            assert_eq!(calls[0].name, "get_time");
            // The prompt opened the thinking: only its closing tag is written.
            let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), true, ThinkTags::XML);
            let text = format!("Mentioning <tool_call> {{\"name\": 1}}</think>{call}");
            let (out, calls, _) = run(&mut w, &text, step);
            assert_eq!(
                out, "Mentioning <tool_call> {\"name\": 1}</think>",
                "step {step}"
            );
            assert_eq!(calls.len(), 1, "step {step}");
        }
        // A Llama answer after thinking is a call when it begins with a brace.
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::LlamaJson, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let text = "<think>{no}</think>\n{\"name\": \"get_time\", \"parameters\": {}}";
        let (out, calls, end) = run(&mut w, text, 3);
        // (The whitespace before a Llama call goes with the call, as without thinking.)
        assert_eq!(out, "<think>{no}</think>");
        assert!(end && calls.len() == 1);
        // `<think>` later in the answer is nothing special.
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let (out, calls, _) = run(&mut w, &format!("Hi <think> {call}"), 4);
        assert_eq!(out, "Hi <think> ");
        assert_eq!(calls.len(), 1);
        // Held bytes that turn out not to open a thinking block are not lost.
        let mut w = CallWatcher::new(tools(ToolChoice::Auto, true), false, ThinkTags::XML);
        let (out, calls, _) = run(&mut w, " <thin", 2);
        assert_eq!(out, " <thin");
        assert!(calls.is_empty());
    }

    #[test]
    fn mistral_calls_are_one_array_after_the_tag_and_end_the_answer() {
        let text = "Checking. [TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}, {\"name\": \"get_time\", \"arguments\": {}}]";
        for step in 1..=14 {
            let mut w = CallWatcher::new(
                tools_in(CallSyntax::Mistral, ToolChoice::Auto, true),
                false,
                ThinkTags::XML,
            );
            let (out, calls, end) = run(&mut w, text, step);
            assert_eq!(out, "Checking. ", "step {step}");
            assert!(end, "the array holds every call of the turn");
            assert_eq!(calls.len(), 2);
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
            assert_eq!(calls[1].name, "get_time");
            for call in &calls {
                assert_eq!(call.id.len(), 9, "Mistral's templates take 9-character ids");
                assert!(call.id.bytes().all(|b| b.is_ascii_alphanumeric()));
            }
            assert_ne!(calls[0].id, calls[1].id);
        }
        // A bracket or a tag's beginning in text is only text.
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::Mistral, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let text = "[1, 2] and [TOOL_CALL] and [TOOL_";
        let (out, calls, end) = run(&mut w, text, 2);
        assert_eq!(out, text);
        assert!(calls.is_empty() && !end);
    }

    #[test]
    fn a_forced_mistral_call_starts_at_once() {
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::Mistral, ToolChoice::Required, false),
            false,
            ThinkTags::XML,
        );
        assert!(!w.is_free(), "the prompt wrote `[TOOL_CALLS]`");
        let (out, calls, end) = run(&mut w, r#"[{"name": "get_time", "arguments": {}}]"#, 4);
        assert_eq!((out.as_str(), calls.len(), end), ("", 1, true));
        // Cut short, the call so far comes back as text.
        let mut w = CallWatcher::new(
            tools_in(CallSyntax::Mistral, ToolChoice::Required, false),
            false,
            ThinkTags::XML,
        );
        let (out, calls, end) = run(&mut w, r#"[{"name": "get_ti"#, 4);
        assert_eq!(
            (out.as_str(), calls.len(), end),
            (r#"[{"name": "get_ti"#, 0, false)
        );
    }

    fn args_tools(call_ids: bool, choice: ToolChoice, parallel: bool) -> ToolSet {
        tools_in(CallSyntax::MistralArgs { call_ids }, choice, parallel)
    }

    #[test]
    fn args_calls_are_a_held_header_then_the_tools_own_arguments() {
        let text =
            "Sure. [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}[TOOL_CALLS]get_time[ARGS]{}";
        for step in 1..=9 {
            let mut w = CallWatcher::new(
                args_tools(false, ToolChoice::Auto, true),
                false,
                ThinkTags::XML,
            );
            let (out, calls, end) = run(&mut w, text, step);
            assert_eq!(out, "Sure. ", "step {step}");
            assert!(!end, "more calls (or text) may follow");
            assert_eq!(calls.len(), 2, "step {step}");
            assert_eq!(
                (calls[0].name.as_str(), calls[0].arguments.as_str()),
                ("get_weather", r#"{"city":"Oslo"}"#)
            );
            assert_eq!(
                (calls[1].name.as_str(), calls[1].arguments.as_str()),
                ("get_time", "{}")
            );
            assert_eq!(calls[0].id.len(), 9);
        }
        // One call only: the first ends the answer.
        let mut w = CallWatcher::new(
            args_tools(false, ToolChoice::Auto, false),
            false,
            ThinkTags::XML,
        );
        let (_, calls, end) = run(&mut w, text, 5);
        assert_eq!((calls.len(), end), (1, true));
    }

    #[test]
    fn the_header_and_then_the_arguments_are_constrained() {
        let mut w = CallWatcher::new(
            args_tools(true, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        assert!(w.is_free());
        w.push(b"[TOOL_CALLS]");
        assert!(matches!(w.constraint(), Some(CallConstraint::Header(_))));
        assert!(!w.is_free());
        w.push(b"get_weather[CALL_ID]a1B2c3D4e");
        assert!(matches!(w.constraint(), Some(CallConstraint::Header(_))));
        w.push(b"[ARGS]");
        // The arguments are held to get_weather's own schema: `city` is required.
        let c = json_of(&mut w);
        assert!(!c.clone().accept(b"{}"));
        let done = w.push(br#"{"city": "Oslo"}"#);
        assert_eq!(done.calls.len(), 1);
        assert_eq!(done.calls[0].id, "a1B2c3D4e", "the id the model wrote");
        assert!(w.is_free());
    }

    #[test]
    fn an_args_header_no_mask_checked_that_fits_no_tool_is_text() {
        // The rest of the token that wrote the tag is the only unchecked text.
        let mut w = CallWatcher::new(
            args_tools(false, ToolChoice::Auto, true),
            false,
            ThinkTags::XML,
        );
        let (out, calls, _) = run(&mut w, "[TOOL_CALLS]nope and more", 64);
        assert_eq!(out, "[TOOL_CALLS]nope and more");
        assert!(calls.is_empty());
        // Cut short in the header or the arguments: all of it comes back as text.
        let mut w = CallWatcher::new(
            args_tools(false, ToolChoice::Required, true),
            false,
            ThinkTags::XML,
        );
        assert!(matches!(w.constraint(), Some(CallConstraint::Header(_))));
        let (out, calls, end) = run(&mut w, "get_wea", 3);
        assert_eq!((out.as_str(), calls.len(), end), ("get_wea", 0, false));
        let mut w = CallWatcher::new(
            args_tools(false, ToolChoice::Required, true),
            false,
            ThinkTags::XML,
        );
        let (out, _, _) = run(&mut w, "get_time[ARGS]{\"a", 3);
        assert_eq!(out, "get_time[ARGS]{\"a");
    }

    #[test]
    fn no_call_is_taken_inside_a_mistral_models_thinking() {
        let text = "[THINK]maybe [TOOL_CALLS]get_time[ARGS]{}?[/THINK][TOOL_CALLS]get_time[ARGS]{}";
        for step in [1, 4, 64] {
            let mut w = CallWatcher::new(
                args_tools(false, ToolChoice::Auto, false),
                false,
                ThinkTags::MISTRAL,
            );
            let (out, calls, end) = run(&mut w, text, step);
            assert_eq!(
                out, "[THINK]maybe [TOOL_CALLS]get_time[ARGS]{}?[/THINK]",
                "step {step}"
            );
            assert_eq!((calls.len(), end), (1, true), "step {step}");
        }
    }
}
