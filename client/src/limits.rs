//! Caps on the lists inside a request, enforced while a frame is decoded.
//!
//! The frame limit bounds a request's bytes, not the memory its decoding takes: an empty
//! string is one byte on the wire and 24 bytes in a `Vec<String>`, so a 1 MiB frame of
//! empty stop strings would decode into about 33 MiB. These caps stop a list at its
//! announced length, before any element is allocated. They are generous for real use
//! and documented in PROTOCOL.md; the wire format does not change.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, SeqAccess, Visitor};

use crate::protocol::{GenerateOption, GenerateRequest};

/// Stop strings per request (OpenAI allows 4).
pub const MAX_STOP_STRINGS: usize = 16;
/// Chat messages per request.
pub const MAX_CHAT_MESSAGES: usize = 65_536;
/// Tools offered in one request, and tool calls in one message.
pub const MAX_TOOLS: usize = 128;
/// Logit-bias entries per request.
pub const MAX_LOGIT_BIAS: usize = 65_536;
/// Options of one `GenerateWith` (each kind may appear once).
pub const MAX_GENERATE_OPTIONS: usize = 16;
/// Bytes of one request's chat-template variables (the JSON object's text).
pub const MAX_TEMPLATE_VARIABLES_BYTES: usize = 64 * 1024;
/// Variable names a `ChatFormatReport` lists (a template reads a handful).
pub const MAX_TEMPLATE_SWITCHES: usize = 256;

/// `deserialize_with` for a `Vec` of at most `N` elements: a longer list is a decoding
/// error before anything is allocated for it.
pub(crate) fn bounded<'de, D, T, const N: usize>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T, const N: usize>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Bounded<T, N> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            write!(f, "a list of at most {N} elements")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            let announced = seq.size_hint().unwrap_or(0);
            if announced > N {
                return Err(de::Error::invalid_length(announced, &self));
            }
            let mut out = Vec::with_capacity(announced);
            while let Some(item) = seq.next_element()? {
                if out.len() == N {
                    return Err(de::Error::invalid_length(N + 1, &self));
                }
                out.push(item);
            }
            Ok(out)
        }
    }

    deserializer.deserialize_seq(Bounded::<T, N>(PhantomData))
}

/// The same caps, checked by a client before it sends, with a message naming the field.
pub fn check_request(request: &GenerateRequest) -> Result<(), String> {
    let over = |field: &str, n: usize, max: usize| {
        Err(format!("{field}: {n} entries, at most {max} are accepted"))
    };
    if request.stop.len() > MAX_STOP_STRINGS {
        return over("stop", request.stop.len(), MAX_STOP_STRINGS);
    }
    if request.sampling.logit_bias.len() > MAX_LOGIT_BIAS {
        return over(
            "logit_bias",
            request.sampling.logit_bias.len(),
            MAX_LOGIT_BIAS,
        );
    }
    match &request.input {
        crate::protocol::PromptInput::Chat { messages } if messages.len() > MAX_CHAT_MESSAGES => {
            return over("messages", messages.len(), MAX_CHAT_MESSAGES);
        }
        crate::protocol::PromptInput::ChatWithTools {
            messages, tools, ..
        } => {
            if messages.len() > MAX_CHAT_MESSAGES {
                return over("messages", messages.len(), MAX_CHAT_MESSAGES);
            }
            if tools.len() > MAX_TOOLS {
                return over("tools", tools.len(), MAX_TOOLS);
            }
            if let Some(m) = messages.iter().find(|m| m.tool_calls.len() > MAX_TOOLS) {
                return over("tool_calls", m.tool_calls.len(), MAX_TOOLS);
            }
        }
        _ => {}
    }
    Ok(())
}

/// The caps on a `GenerateWith`'s options, checked by a client before it sends: at most
/// [`MAX_GENERATE_OPTIONS`], each kind once, template variables within
/// [`MAX_TEMPLATE_VARIABLES_BYTES`].
pub fn check_options(options: &[GenerateOption]) -> Result<(), String> {
    if options.len() > MAX_GENERATE_OPTIONS {
        return Err(format!(
            "options: {} entries, at most {MAX_GENERATE_OPTIONS} are accepted",
            options.len()
        ));
    }
    for (i, option) in options.iter().enumerate() {
        let kind = std::mem::discriminant(option);
        if options[..i]
            .iter()
            .any(|o| std::mem::discriminant(o) == kind)
        {
            return Err(format!("options: {} given twice", option_name(option)));
        }
        match option {
            GenerateOption::TemplateVariables(json)
                if json.len() > MAX_TEMPLATE_VARIABLES_BYTES =>
            {
                return Err(format!(
                    "chat_template_kwargs: {} bytes, at most {MAX_TEMPLATE_VARIABLES_BYTES} are accepted",
                    json.len()
                ));
            }
            GenerateOption::TemplateVariables(_) | GenerateOption::StreamToolCalls => {}
        }
    }
    Ok(())
}

/// How an option is named in messages (the OpenAI-side name where there is one).
fn option_name(option: &GenerateOption) -> &'static str {
    match option {
        GenerateOption::TemplateVariables(_) => "chat_template_kwargs",
        GenerateOption::StreamToolCalls => "stream tool calls",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::decode_payload;
    use crate::protocol::{ChatMessage, ClientMessage, PromptInput, SamplingParams};

    fn request(stop: usize, messages: usize, bias: usize) -> GenerateRequest {
        GenerateRequest {
            id: 1,
            model: None,
            input: PromptInput::Chat {
                messages: vec![ChatMessage::new("", ""); messages],
            },
            sampling: SamplingParams {
                logit_bias: vec![(0, 0.0); bias],
                ..SamplingParams::default()
            },
            max_tokens: None,
            stop: vec![String::new(); stop],
            logprobs: None,
        }
    }

    fn roundtrip(r: GenerateRequest) -> Result<ClientMessage, crate::codec::CodecError> {
        let bytes = postcard::to_allocvec(&ClientMessage::Generate(r)).unwrap();
        decode_payload(&bytes)
    }

    #[test]
    fn lists_at_their_caps_decode() {
        let r = request(MAX_STOP_STRINGS, MAX_CHAT_MESSAGES, MAX_LOGIT_BIAS);
        assert!(check_request(&r).is_ok());
        assert_eq!(roundtrip(r.clone()).unwrap(), ClientMessage::Generate(r));
    }

    #[test]
    fn lists_past_their_caps_are_refused_by_both_sides() {
        for r in [
            request(MAX_STOP_STRINGS + 1, 1, 0),
            request(0, MAX_CHAT_MESSAGES + 1, 0),
            request(0, 1, MAX_LOGIT_BIAS + 1),
        ] {
            let why = check_request(&r).unwrap_err();
            assert!(why.contains("at most"), "{why}");
            assert!(roundtrip(r).is_err());
        }
    }

    #[test]
    fn a_frame_of_empty_stop_strings_is_refused_before_allocating() {
        // The attack this guards against: 1 MiB of one-byte empty strings. The
        // announced length alone is refused; nothing past it is read.
        let mut bytes = postcard::to_allocvec(&ClientMessage::Generate(request(0, 0, 0))).unwrap();
        // Re-encode with a huge stop list by hand: find the stop list's length byte
        // (0, just before the logprobs `None`) and replace it.
        let n: u32 = 1 << 20;
        let tail = bytes.split_off(bytes.len() - 2);
        assert_eq!(tail, [0, 0], "stop length then logprobs None");
        let mut len = Vec::new();
        let mut v = n;
        while v >= 0x80 {
            len.push((v as u8) | 0x80);
            v >>= 7;
        }
        len.push(v as u8);
        bytes.extend_from_slice(&len);
        bytes.extend(std::iter::repeat_n(0u8, n as usize));
        bytes.push(0);
        assert!(decode_payload::<ClientMessage>(&bytes).is_err());
    }
}
