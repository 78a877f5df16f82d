//! Special tokens: attributes from GGUF token types, llama.cpp's by-name detection of
//! end-of-generation tokens, and splitting special-token text out of a prompt.

/// Token attributes (llama.cpp's `llama_token_attr` subset that tokenization uses).
pub(crate) mod attr {
    pub const UNDEFINED: u8 = 0;
    pub const UNKNOWN: u8 = 1 << 0;
    pub const UNUSED: u8 = 1 << 1;
    pub const NORMAL: u8 = 1 << 2;
    pub const CONTROL: u8 = 1 << 3;
    pub const USER_DEFINED: u8 = 1 << 4;
    pub const BYTE: u8 = 1 << 5;

    /// GGUF `tokenizer.ggml.token_type` value to attribute.
    pub fn from_token_type(t: i32) -> u8 {
        match t {
            1 => NORMAL,
            2 => UNKNOWN,
            3 => CONTROL,
            4 => USER_DEFINED,
            5 => UNUSED,
            6 => BYTE,
            _ => UNDEFINED,
        }
    }
}

/// Texts llama.cpp takes for the end-of-turn token when the file names none, in the
/// order we prefer them (llama.cpp's own pick among several is hash-map order).
pub(crate) const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

pub(crate) const EOM_TEXTS: &[&str] = &["<|eom_id|>"];

/// Fill-in-the-middle tokens: llama.cpp marks them control, and the pad, repo and file
/// separator ones also end generation.
pub(crate) const FIM_TEXTS: &[&[&str]] = &[
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
];
pub(crate) const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

/// Every token with one of these texts ends generation in llama.cpp.
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// A piece of a prompt after special tokens are split out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(std::ops::Range<usize>),
    Token(u32),
}

/// Splits `text` around occurrences of the given special tokens, longest token text first
/// (llama.cpp's `tokenizer_st_partition`): each token in turn is cut out of every
/// remaining text fragment, left to right.
pub(crate) fn partition<'a>(
    text: &str,
    specials: impl Iterator<Item = (u32, &'a str)>,
) -> Vec<Fragment> {
    let mut frags = vec![Fragment::Text(0..text.len())];
    if text.is_empty() {
        return Vec::new();
    }
    for (id, needle) in specials {
        if needle.is_empty() || !text.contains(needle) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for frag in frags {
            let Fragment::Text(range) = frag else {
                next.push(frag);
                continue;
            };
            let mut at = range.start;
            while let Some(found) = text[at..range.end].find(needle) {
                let start = at + found;
                if start > at {
                    next.push(Fragment::Text(at..start));
                }
                next.push(Fragment::Token(id));
                at = start + needle.len();
            }
            if at < range.end {
                next.push(Fragment::Text(at..range.end));
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_prefers_longer_tokens_and_keeps_text_between() {
        let text = "<a><ab>x<a>";
        // Longest first, as the tokenizer passes them.
        let frags = partition(text, [(2, "<ab>"), (1, "<a>")].into_iter());
        assert_eq!(
            frags,
            [
                Fragment::Token(1),
                Fragment::Token(2),
                Fragment::Text(7..8),
                Fragment::Token(1)
            ]
        );
        assert!(partition("", [(1, "<a>")].into_iter()).is_empty());
        assert_eq!(
            partition("plain", [(1, "<a>")].into_iter()),
            [Fragment::Text(0..5)]
        );
    }
}
