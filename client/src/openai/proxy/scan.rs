//! Finds the engine's own report in the last bytes of a response body, by byte search:
//! no JSON decoding.
//!
//! Keys are matched with their quotes and colon, so `"completion_tokens":` never matches
//! `completion_tokens_details` and `"eval_count":` never matches `prompt_eval_count`.
//! Generated text cannot fake a key either: inside a JSON string every quote is escaped
//! (`\"`), so the bytes `"completion_tokens":` only occur as a real key. The engine sends
//! its report last, so the last occurrence of each key is the one that counts.

use memchr::memmem;

use crate::protocol::FinishReason;

const COMPLETION_TOKENS: &[u8] = b"\"completion_tokens\":";
const PROMPT_TOKENS: &[u8] = b"\"prompt_tokens\":";
const EVAL_COUNT: &[u8] = b"\"eval_count\":";
const PROMPT_EVAL_COUNT: &[u8] = b"\"prompt_eval_count\":";
const EVAL_DURATION: &[u8] = b"\"eval_duration\":";
const PROMPT_EVAL_DURATION: &[u8] = b"\"prompt_eval_duration\":";
const FINISH_REASON: &[u8] = b"\"finish_reason\":";
const DONE_REASON: &[u8] = b"\"done_reason\":";

/// The longest finish reason worth reading (`content_filter`, `tool_calls`...).
const MAX_REASON_BYTES: usize = 32;

/// What the engine said about a request, as far as the scanned bytes tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineReport {
    pub prompt_tokens: Option<u32>,
    pub completion_tokens: Option<u32>,
    /// Ollama's `eval_duration`: the engine's own decode time, in nanoseconds.
    pub decode_ns: Option<u64>,
    /// Ollama's `prompt_eval_duration`, in nanoseconds.
    pub prefill_ns: Option<u64>,
    pub finish: Option<FinishReason>,
}

impl EngineReport {
    /// True when the engine reported any count at all.
    pub fn has_counts(&self) -> bool {
        self.prompt_tokens.is_some() || self.completion_tokens.is_some()
    }
}

/// Scans `bytes` (the end of a body) for an OpenAI `usage` object or Ollama's counters.
/// OpenAI's keys win when both are present (Ollama's own OpenAI endpoints send only
/// those).
pub fn scan(bytes: &[u8]) -> EngineReport {
    let openai = (
        last_uint(bytes, PROMPT_TOKENS),
        last_uint(bytes, COMPLETION_TOKENS),
    );
    let (prompt, completion, decode_ns, prefill_ns) = if openai.0.is_some() || openai.1.is_some() {
        (openai.0, openai.1, None, None)
    } else {
        (
            last_uint(bytes, PROMPT_EVAL_COUNT),
            last_uint(bytes, EVAL_COUNT),
            last_uint(bytes, EVAL_DURATION),
            last_uint(bytes, PROMPT_EVAL_DURATION),
        )
    };
    EngineReport {
        prompt_tokens: prompt.map(saturate_u32),
        completion_tokens: completion.map(saturate_u32),
        decode_ns,
        prefill_ns,
        finish: finish_reason(bytes),
    }
}

fn saturate_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The integer after the last `key`, or `None` when the key is absent or its value is
/// not a whole, terminated number (`null`, a float, digits cut off by the end).
fn last_uint(bytes: &[u8], key: &[u8]) -> Option<u64> {
    let at = memmem::rfind(bytes, key)? + key.len();
    parse_uint(&bytes[at..])
}

fn parse_uint(rest: &[u8]) -> Option<u64> {
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = &rest[start..];
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    // The number must be followed by something: digits at the very end may be cut short.
    let next = *rest.get(digits)?;
    if digits == 0 || digits > 19 || matches!(next, b'.' | b'e' | b'E') {
        return None;
    }
    rest[..digits].iter().try_fold(0u64, |n, &d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// The last finish reason that is a string (streams send `null` until the end), from
/// OpenAI's `finish_reason` or Ollama's `done_reason`, whichever comes later.
fn finish_reason(bytes: &[u8]) -> Option<FinishReason> {
    let openai = last_string(bytes, FINISH_REASON);
    let ollama = last_string(bytes, DONE_REASON);
    let (_, word) = match (openai, ollama) {
        (Some(a), Some(b)) => {
            if a.0 > b.0 {
                a
            } else {
                b
            }
        }
        (a, b) => a.or(b)?,
    };
    Some(match word {
        b"length" => FinishReason::Length,
        // `stop`, `tool_calls`, `content_filter`, `unload`...: the engine ended it.
        _ => FinishReason::Stop,
    })
}

/// The position and value of the last `key` whose value is a short string.
fn last_string<'a>(bytes: &'a [u8], key: &[u8]) -> Option<(usize, &'a [u8])> {
    let mut end = bytes.len();
    loop {
        let at = memmem::rfind(&bytes[..end], key)?;
        if let Some(word) = string_value(&bytes[at + key.len()..]) {
            return Some((at, word));
        }
        end = at;
    }
}

fn string_value(rest: &[u8]) -> Option<&[u8]> {
    let start = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    let rest = rest[start..].strip_prefix(b"\"")?;
    let len = memchr::memchr(b'"', &rest[..rest.len().min(MAX_REASON_BYTES + 1)])?;
    Some(&rest[..len])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_need_their_quotes_and_colon() {
        let body = br#"{"usage":{"completion_tokens_details":{"x":1},"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":5},"prompt_tokens":33}}"#;
        let r = scan(body);
        assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(33), Some(12)));
        // `"eval_count":` is not found inside `"prompt_eval_count":`.
        let r = scan(br#"{"prompt_eval_count":26,"done":true}"#);
        assert_eq!((r.prompt_tokens, r.completion_tokens), (Some(26), None));
    }

    #[test]
    fn the_last_report_wins_and_null_or_cut_values_are_no_report() {
        let stream = b"data: {\"usage\":{\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"completion_tokens\":7}}\n\n";
        assert_eq!(scan(stream).completion_tokens, Some(7));
        assert_eq!(
            scan(br#"{"completion_tokens":null}"#).completion_tokens,
            None
        );
        assert_eq!(
            scan(br#"{"completion_tokens":1.5}"#).completion_tokens,
            None
        );
        // A body cut in the middle of the number says nothing reliable.
        assert_eq!(scan(br#"{"completion_tokens":12"#).completion_tokens, None);
        assert_eq!(
            scan(b"{\"completion_tokens\": \n 12 }").completion_tokens,
            Some(12)
        );
        assert_eq!(
            scan(br#"{"completion_tokens":99999999999}"#).completion_tokens,
            Some(u32::MAX)
        );
    }

    #[test]
    fn finish_reason_is_the_last_string_value() {
        let stream = b"data: {\"finish_reason\":\"length\"}\n\ndata: {\"choices\":[{\"finish_reason\":null}]}\n\n";
        assert_eq!(scan(stream).finish, Some(FinishReason::Length));
        assert_eq!(
            scan(br#"{"done_reason":"stop","done":true}"#).finish,
            Some(FinishReason::Stop)
        );
        assert_eq!(scan(br#"{"finish_reason":null}"#).finish, None);
        assert_eq!(
            scan(br#"{"finish_reason":"tool_calls"}"#).finish,
            Some(FinishReason::Stop)
        );
    }
}
