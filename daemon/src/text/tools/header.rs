//! The part of a call in Mistral's `[ARGS]` syntax that is not JSON: after
//! `[TOOL_CALLS]`, the tool's name, then (Mistral Small 3.2) `[CALL_ID]` and an id of
//! nine letters and digits, then `[ARGS]`, where the arguments' JSON begins.
//!
//! [`CallHeader`] holds what has been written of it against the tools that may be
//! called, so the sampler can mask every token that would leave that language, as the
//! JSON constraint does for the arguments: the name is always an offered tool's.

use std::sync::Arc;

use crate::text::sampler::TokenFilter;
use crate::text::Tokenizer;

use super::MISTRAL_ID_LEN;

/// The control token between a call's name (or id) and its arguments.
pub const ARGS: &str = "[ARGS]";
/// The control token before a call's id.
pub const CALL_ID: &str = "[CALL_ID]";

/// How far a header has got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderCheck {
    /// No header begins with these bytes.
    Invalid,
    /// A header may still be completed.
    Partial,
    /// Complete: the index of the named tool, and the id the model wrote.
    Done { tool: usize, id: Option<String> },
}

/// One call's header as it is written.
#[derive(Debug, Clone)]
pub struct CallHeader {
    /// The names of the tools that may be called, in the order of the tool set.
    names: Arc<[String]>,
    /// Whether an id (`[CALL_ID]` and nine letters and digits) comes before `[ARGS]`.
    call_ids: bool,
    written: Vec<u8>,
}

impl CallHeader {
    pub fn new(names: Arc<[String]>, call_ids: bool) -> Self {
        Self {
            names,
            call_ids,
            written: Vec::new(),
        }
    }

    /// Takes `bytes` as written; what the header is then.
    pub fn accept(&mut self, bytes: &[u8]) -> HeaderCheck {
        self.written.extend_from_slice(bytes);
        self.check(&self.written)
    }

    /// Whether `bytes` may be written next (the header not complete before their end).
    pub fn allows(&self, bytes: &[u8]) -> bool {
        // The longest header is a 64-byte name, `[CALL_ID]`, nine bytes and `[ARGS]`:
        // the sampler asks this of every token of the vocabulary, so no allocation.
        let mut next = [0u8; 96];
        let len = self.written.len() + bytes.len();
        if bytes.is_empty() || len > next.len() {
            return false;
        }
        next[..self.written.len()].copy_from_slice(&self.written);
        next[self.written.len()..len].copy_from_slice(bytes);
        self.check(&next[..len]) != HeaderCheck::Invalid
    }

    /// The bytes that may come next, one flag per byte value: what a token must begin
    /// with to be allowed, so a mask rejects most of a vocabulary on its first byte.
    pub fn next_bytes(&self) -> [bool; 256] {
        let mut next = [false; 256];
        for (b, ok) in next.iter_mut().enumerate() {
            *ok = self.allows(&[b as u8]);
        }
        next
    }

    fn check(&self, written: &[u8]) -> HeaderCheck {
        let mut partial = false;
        for (tool, name) in self.names.iter().enumerate() {
            match self.check_one(name.as_bytes(), written) {
                Some(OneTool::Partial) => partial = true,
                Some(OneTool::Done(id)) => return HeaderCheck::Done { tool, id },
                None => {}
            }
        }
        if partial {
            HeaderCheck::Partial
        } else {
            HeaderCheck::Invalid
        }
    }

    /// How `written` stands against the header of the tool called `name` (`None`: it
    /// is not that header's beginning).
    fn check_one(&self, name: &[u8], written: &[u8]) -> Option<OneTool> {
        // `prefix` of `literal`: a beginning of it (`Some(false)`), all of it
        // (`Some(true)`), or neither.
        fn prefix(literal: &[u8], bytes: &[u8]) -> Option<bool> {
            if bytes.len() <= literal.len() {
                literal
                    .starts_with(bytes)
                    .then_some(bytes.len() == literal.len())
            } else {
                None
            }
        }
        let done = |done: bool, id: Option<&[u8]>| {
            if done {
                OneTool::Done(id.map(|id| String::from_utf8_lossy(id).into_owned()))
            } else {
                OneTool::Partial
            }
        };
        if written.len() <= name.len() {
            return name.starts_with(written).then_some(OneTool::Partial);
        }
        let rest = written.strip_prefix(name)?;
        if !self.call_ids {
            return prefix(ARGS.as_bytes(), rest).map(|d| done(d, None));
        }
        if prefix(CALL_ID.as_bytes(), rest).is_some() {
            return Some(OneTool::Partial);
        }
        let rest = rest.strip_prefix(CALL_ID.as_bytes())?;
        let id_len = rest.len().min(MISTRAL_ID_LEN);
        if !rest[..id_len].iter().all(u8::is_ascii_alphanumeric) {
            return None;
        }
        if rest.len() <= MISTRAL_ID_LEN {
            return Some(OneTool::Partial);
        }
        let (id, rest) = rest.split_at(MISTRAL_ID_LEN);
        prefix(ARGS.as_bytes(), rest).map(|d| done(d, Some(id)))
    }
}

/// How a header stands against one tool's.
enum OneTool {
    Partial,
    /// Complete, with the id written (if the syntax has one).
    Done(Option<String>),
}

/// A [`CallHeader`] with the vocabulary it reads tokens from, as the sampler takes it.
/// A control token counts only when it is one of the header's tags (the watcher reads
/// only those); end-of-generation tokens never fit.
pub struct HeaderFilter<'a> {
    pub header: &'a CallHeader,
    pub tokenizer: &'a Tokenizer,
}

impl HeaderFilter<'_> {
    fn bytes(&self, token: u32) -> Option<&[u8]> {
        let tok = self.tokenizer;
        let bytes = tok.token_bytes(token);
        let tag = bytes == ARGS.as_bytes() || bytes == CALL_ID.as_bytes();
        let usable = !tok.is_eog(token) && (tag || !tok.is_control(token));
        usable.then_some(bytes)
    }
}

impl TokenFilter for HeaderFilter<'_> {
    fn allows(&mut self, token: u32) -> bool {
        self.bytes(token).is_some_and(|b| self.header.allows(b))
    }

    fn mask(&mut self, logits: &mut [f32]) -> usize {
        // Checking every token against every name costs milliseconds over a large
        // vocabulary, a stall of the whole batch at each step of a header: the first
        // byte settles most tokens.
        let first = self.header.next_bytes();
        let mut left = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            if *l == f32::NEG_INFINITY {
                continue;
            }
            let token = id as u32;
            let may =
                (self.tokenizer.token_bytes(token).first()).is_some_and(|&b| first[b as usize]);
            if may && self.allows(token) {
                left += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        left
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(call_ids: bool) -> CallHeader {
        let names: Vec<String> = vec!["get".into(), "get_weather".into()];
        CallHeader::new(names.into(), call_ids)
    }

    fn check(h: &CallHeader, text: &str) -> HeaderCheck {
        h.clone().accept(text.as_bytes())
    }

    #[test]
    fn a_header_is_an_offered_name_then_args() {
        let h = header(false);
        assert_eq!(check(&h, "ge"), HeaderCheck::Partial);
        assert_eq!(check(&h, "get"), HeaderCheck::Partial);
        assert_eq!(check(&h, "get_w"), HeaderCheck::Partial);
        assert_eq!(check(&h, "get[AR"), HeaderCheck::Partial);
        assert_eq!(
            check(&h, "get[ARGS]"),
            HeaderCheck::Done { tool: 0, id: None }
        );
        assert_eq!(
            check(&h, "get_weather[ARGS]"),
            HeaderCheck::Done { tool: 1, id: None }
        );
        for bad in ["x", "get_time", "get[ARGS]{", "get [ARGS]", "get[CALL_ID]"] {
            assert_eq!(check(&h, bad), HeaderCheck::Invalid, "{bad}");
        }
        assert!(h.allows(b"get_"));
        assert!(!h.allows(b""));
        assert!(!h.allows(b"got"));
    }

    #[test]
    fn with_call_ids_the_name_is_followed_by_nine_letters_and_digits() {
        let h = header(true);
        assert_eq!(check(&h, "get[CALL_"), HeaderCheck::Partial);
        assert_eq!(check(&h, "get[CALL_ID]a1B2"), HeaderCheck::Partial);
        assert_eq!(check(&h, "get[CALL_ID]a1B2c3D4e[AR"), HeaderCheck::Partial);
        assert_eq!(
            check(&h, "get_weather[CALL_ID]a1B2c3D4e[ARGS]"),
            HeaderCheck::Done {
                tool: 1,
                id: Some("a1B2c3D4e".into())
            }
        );
        for bad in [
            "get[ARGS]",
            "get[CALL_ID]a1-2",
            "get[CALL_ID]a1B2c3D4e5",
            "get[CALL_ID]a1B2c3D4[ARGS]",
        ] {
            assert_eq!(check(&h, bad), HeaderCheck::Invalid, "{bad}");
        }
    }

    #[test]
    fn the_filter_takes_only_the_header_tags_among_control_tokens() {
        let mut spec = crate::text::bpe_spec("gpt-2");
        for tag in [ARGS, CALL_ID, "[INST]"] {
            spec.tokens.push(tag.into());
            spec.token_types.as_mut().expect("types").push(3);
        }
        let tok = Tokenizer::new(spec).expect("a vocabulary");
        let id = |t: &str| tok.token_id(t).expect(t);
        let mut h = header(false);
        h.accept(b"get");
        let mut filter = HeaderFilter {
            header: &h,
            tokenizer: &tok,
        };
        assert!(filter.allows(id(ARGS)));
        assert!(!filter.allows(id("[INST]")));
        assert!(
            !filter.allows(id("<|im_end|>")),
            "no end before the arguments"
        );
        assert!(filter.allows(id("_")));
        assert!(!filter.allows(id("a")));
        let mut logits = vec![0.0f32; tok.vocab_size()];
        let left = filter.mask(&mut logits);
        assert_eq!(left, 3, "`[ARGS]`, `[` and `_`");
        assert_eq!(logits[id(ARGS) as usize], 0.0);
        assert_eq!(logits[id("a") as usize], f32::NEG_INFINITY);
    }

    #[test]
    fn the_mask_keeps_exactly_the_tokens_the_filter_allows() {
        let mut spec = crate::text::bpe_spec("gpt-2");
        for tag in [ARGS, CALL_ID] {
            spec.tokens.push(tag.into());
            spec.token_types.as_mut().expect("types").push(3);
        }
        let tok = Tokenizer::new(spec).expect("a vocabulary");
        for (call_ids, written) in [
            (false, ""),
            (false, "get"),
            (false, "get_wea"),
            (false, "get[AR"),
            (true, "get"),
            (true, "get_weather[CALL_ID]a1"),
            (true, "get[CALL_ID]a1B2c3D4e"),
        ] {
            let mut h = header(call_ids);
            h.accept(written.as_bytes());
            let mut filter = HeaderFilter {
                header: &h,
                tokenizer: &tok,
            };
            let mut logits = vec![0.0f32; tok.vocab_size()];
            let left = filter.mask(&mut logits);
            let mut allowed = 0;
            for (id, &l) in logits.iter().enumerate() {
                let allows = filter.allows(id as u32);
                allowed += usize::from(allows);
                assert_eq!(l == 0.0, allows, "{written:?}: token {id}");
            }
            assert_eq!(left, allowed, "{written:?}");
            assert!(left > 0, "{written:?}: some token goes on");
        }
    }
}
