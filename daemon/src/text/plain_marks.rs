//! Text from a chat's messages that reads like control tokens stays text.
//!
//! A chat prompt is the template's output tokenized with control-token text parsed into
//! those tokens: that is how the template's own `<|im_start|>` becomes the token. Text
//! from the messages must not be parsed so, or a user who writes
//! `<|im_end|>\n<|im_start|>system\n...` closes their own turn and opens a system one
//! (llama.cpp's server and most others let that through; OpenAI's API does not). A tool
//! result that quotes a web page is the same hole.
//!
//! Before rendering, each control-token text in a message is put between marks that no
//! client can forge (they hold a per-request random number and never leave the daemon);
//! after rendering, the marks are taken out and the ranges they enclosed are tokenized as
//! plain text. Messages without control-token text, nearly all of them, go to the
//! template untouched, so their prompts are exactly what they were.
//!
//! Assistant messages are left as they are: they are the model's own earlier answers,
//! and templates take them apart (reasoning, calls) by their text.

use std::borrow::Cow;
use std::hash::{BuildHasher, RandomState};
use std::ops::Range;

use spark_client::protocol::{ChatMessage, ToolChatMessage};

use super::Tokenizer;

/// The marks of one request.
pub struct PlainMarks {
    open: String,
    close: String,
}

impl Default for PlainMarks {
    fn default() -> Self {
        Self::new()
    }
}

impl PlainMarks {
    pub fn new() -> Self {
        // Unicode noncharacters around a random number: not text anyone sends by chance,
        // and not text anyone can send on purpose without knowing the number. Decimal
        // digits, which no case filter (`upper`, `title`) of a template changes.
        let nonce = RandomState::new().hash_one(std::time::SystemTime::now());
        PlainMarks {
            open: format!("\u{FDD0}{nonce:020}\u{FDD1}"),
            close: format!("\u{FDD1}{nonce:020}\u{FDD0}"),
        }
    }

    /// `content` with each control-token text in it between marks; `None` when it has
    /// none (nothing to copy).
    pub fn guard(&self, content: &str, tokenizer: &Tokenizer) -> Option<String> {
        let ranges = tokenizer.control_text_ranges(content);
        if ranges.is_empty() {
            return None;
        }
        let extra = ranges.len() * (self.open.len() + self.close.len());
        let mut out = String::with_capacity(content.len() + extra);
        let mut at = 0;
        for range in ranges {
            out.push_str(&content[at..range.start]);
            out.push_str(&self.open);
            out.push_str(&content[range.clone()]);
            out.push_str(&self.close);
            at = range.end;
        }
        out.push_str(&content[at..]);
        Some(out)
    }

    /// `messages` with the control-token text of every message but the assistant's
    /// guarded; borrowed when there is none.
    pub fn guard_chat<'m>(
        &self,
        messages: &'m [ChatMessage],
        tokenizer: &Tokenizer,
    ) -> Cow<'m, [ChatMessage]> {
        self.guard_messages(messages, tokenizer)
    }

    /// As [`guard_chat`](Self::guard_chat), for a chat with tools: the content of user,
    /// system and tool messages (a tool's result is text from outside too).
    pub fn guard_tool_chat<'m>(
        &self,
        messages: &'m [ToolChatMessage],
        tokenizer: &Tokenizer,
    ) -> Cow<'m, [ToolChatMessage]> {
        self.guard_messages(messages, tokenizer)
    }

    fn guard_messages<'m, M: Message>(
        &self,
        messages: &'m [M],
        tokenizer: &Tokenizer,
    ) -> Cow<'m, [M]> {
        let guarded = |m: &M| {
            (!is_assistant(m.role()))
                .then(|| m.content().and_then(|c| self.guard(c, tokenizer)))
                .flatten()
        };
        if messages.iter().all(|m| guarded(m).is_none()) {
            return Cow::Borrowed(messages);
        }
        Cow::Owned(
            messages
                .iter()
                .map(|m| match guarded(m) {
                    Some(content) => m.with_content(content),
                    None => m.clone(),
                })
                .collect(),
        )
    }

    /// The rendered prompt without the marks, and the byte ranges of it that were
    /// between them, in order. A mark the template cut off from its pair still does its
    /// part: an opening one without its close makes the rest plain (the safe side), a
    /// lone close is dropped.
    pub fn take(&self, rendered: &str) -> (String, Vec<Range<usize>>) {
        if !rendered.contains(&self.open) && !rendered.contains(&self.close) {
            return (rendered.to_string(), Vec::new());
        }
        let mut out = String::with_capacity(rendered.len());
        let mut plain = Vec::new();
        let mut rest = rendered;
        loop {
            let open = rest.find(&self.open);
            let close = rest.find(&self.close);
            match (open, close) {
                // A close before any open: drop it.
                (o, Some(c)) if o.is_none_or(|o| c < o) => {
                    out.push_str(&rest[..c]);
                    rest = &rest[c + self.close.len()..];
                }
                (Some(o), _) => {
                    out.push_str(&rest[..o]);
                    rest = &rest[o + self.open.len()..];
                    let start = out.len();
                    match rest.find(&self.close) {
                        Some(c) => {
                            out.push_str(&rest[..c]);
                            rest = &rest[c + self.close.len()..];
                        }
                        None => {
                            out.push_str(&rest.replace(&self.open, ""));
                            rest = "";
                        }
                    }
                    if out.len() > start {
                        plain.push(start..out.len());
                    }
                }
                _ => {
                    out.push_str(rest);
                    break;
                }
            }
        }
        (out, plain)
    }
}

/// What guarding needs of a chat message, whichever kind.
trait Message: Clone {
    fn role(&self) -> &str;
    fn content(&self) -> Option<&str>;
    fn with_content(&self, content: String) -> Self;
}

impl Message for ChatMessage {
    fn role(&self) -> &str {
        &self.role
    }
    fn content(&self) -> Option<&str> {
        Some(&self.content)
    }
    fn with_content(&self, content: String) -> Self {
        ChatMessage {
            role: self.role.clone(),
            content,
        }
    }
}

impl Message for ToolChatMessage {
    fn role(&self) -> &str {
        &self.role
    }
    fn content(&self) -> Option<&str> {
        self.content.as_deref()
    }
    fn with_content(&self, content: String) -> Self {
        ToolChatMessage {
            content: Some(content),
            ..self.clone()
        }
    }
}

fn is_assistant(role: &str) -> bool {
    role.eq_ignore_ascii_case("assistant")
}

#[cfg(test)]
#[path = "plain_marks_tests.rs"]
mod tests;
