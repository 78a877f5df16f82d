//! Separates a reasoning model's thinking from its answer, as the text streams.
//!
//! Qwen 3, QwQ, DeepSeek-R1's distillations and SmolLM3 open their answer with
//! `<think>` ... `</think>`; Magistral and Ministral's reasoning models with the control
//! tokens `[THINK]` ... `[/THINK]` ([`ThinkTags`]). Some templates end the prompt with
//! the opening tag themselves, so the answer starts inside the thinking and only the
//! closing tag is written. Reasoning is only recognised at the start of the answer (an
//! opening tag later on is answer text), the tags are dropped, and so is the whitespace
//! between the closing tag and the answer. A generation that ends while still thinking
//! was all reasoning.

use super::Tokenizer;

/// The tags around a model's thinking (also read by the tool-call watcher, which takes
/// no calls inside them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThinkTags {
    pub open: &'static str,
    pub close: &'static str,
}

impl ThinkTags {
    /// `<think>` and `</think>`: Qwen 3, QwQ, DeepSeek-R1, SmolLM3 and most others.
    pub const XML: ThinkTags = ThinkTags {
        open: "<think>",
        close: "</think>",
    };
    /// `[THINK]` and `[/THINK]`: Mistral's reasoning models.
    pub const MISTRAL: ThinkTags = ThinkTags {
        open: "[THINK]",
        close: "[/THINK]",
    };

    /// The tags this vocabulary's model thinks in: Mistral's when both are its tokens.
    pub fn of_vocabulary(tokenizer: &Tokenizer) -> Self {
        let has = |t: &str| tokenizer.token_id(t).is_some();
        if has(Self::MISTRAL.open) && has(Self::MISTRAL.close) {
            Self::MISTRAL
        } else {
            Self::XML
        }
    }

    /// The ids of these tags where the vocabulary makes them control tokens, which the
    /// text stream must then show (it drops the other control tokens).
    pub fn control_ids(self, tokenizer: &Tokenizer) -> Vec<u32> {
        [self.open, self.close]
            .into_iter()
            .filter_map(|t| tokenizer.token_id(t))
            .filter(|&id| tokenizer.is_control(id))
            .collect()
    }
}

/// One piece of text, split.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the answer's first text other than whitespace (held): `<think>` opens
    /// the reasoning, anything else is the answer.
    Start,
    /// Inside the reasoning; `held` may begin the closing tag.
    Thinking,
    /// After the closing tag: whitespace before the answer is dropped.
    AfterThinking,
    /// The answer.
    Answer,
}

/// One generation's splitter.
#[derive(Debug)]
pub struct ReasoningSplitter {
    state: State,
    held: String,
    tags: ThinkTags,
}

impl ReasoningSplitter {
    /// `opened_by_prompt`: the prompt ends with the opening tag (see
    /// [`prompt_opens_thinking`]).
    pub fn new(opened_by_prompt: bool, tags: ThinkTags) -> Self {
        Self {
            state: if opened_by_prompt {
                State::Thinking
            } else {
                State::Start
            },
            held: String::new(),
            tags,
        }
    }

    /// Takes the next piece of generated text.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        self.take(text, &mut out);
        out
    }

    fn take(&mut self, text: &str, out: &mut Split) {
        match self.state {
            State::Start => self.start(text, out),
            State::Thinking => self.thinking(text, out),
            State::AfterThinking => {
                let answer = text.trim_start();
                if !answer.is_empty() {
                    self.state = State::Answer;
                    out.content.push_str(answer);
                }
            }
            State::Answer => out.content.push_str(text),
        }
    }

    /// The generation ended: what was held back, where it belongs.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::Thinking => Split {
                reasoning: held,
                content: String::new(),
            },
            _ => Split {
                reasoning: String::new(),
                content: held,
            },
        }
    }

    fn start(&mut self, text: &str, out: &mut Split) {
        // Whitespace before the tag is held: it belongs to neither part if the tag comes.
        self.held.push_str(text);
        let candidate = self
            .held
            .trim_start_matches(|c: char| c.is_ascii_whitespace());
        let open = self.tags.open;
        if let Some(after) = candidate.strip_prefix(open) {
            let after = after.to_string();
            self.held.clear();
            self.state = State::Thinking;
            self.take(&after, out);
        } else if !open.starts_with(candidate) {
            // Not a tag: the held text is the answer's start.
            self.state = State::Answer;
            out.content.push_str(&std::mem::take(&mut self.held));
        }
    }

    fn thinking(&mut self, text: &str, out: &mut Split) {
        let close = self.tags.close;
        self.held.push_str(text);
        if let Some(at) = self.held.find(close) {
            out.reasoning.push_str(&self.held[..at]);
            let after = self.held[at + close.len()..].to_string();
            self.held.clear();
            self.state = State::AfterThinking;
            self.take(&after, out);
            return;
        }
        // Keep the longest tail that may begin the closing tag; the rest is reasoning.
        let len = self.held.len();
        let keep = (1..close.len().min(len + 1))
            .rev()
            .find(|&n| {
                self.held.is_char_boundary(len - n) && close.starts_with(&self.held[len - n..])
            })
            .unwrap_or(0);
        out.reasoning.push_str(&self.held[..len - keep]);
        self.held.drain(..len - keep);
    }
}

/// Whether a rendered prompt leaves the model inside its thinking (the template wrote
/// the opening tag as the generation prompt's end, as DeepSeek-R1's and QwQ's do).
pub fn prompt_opens_thinking(prompt: &str, tags: ThinkTags) -> bool {
    prompt.trim_end().ends_with(tags.open)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pieces to glue into random answers: the tags, their beginnings, whitespace,
    /// multibyte characters.
    const FRAGMENTS: &[&str] = &[
        "<think>", "</think>", "<", "</", "<th", "</thi", ">", " ", "\n", "a", "é", "😀", "think",
        "[THINK]", "[/THINK]", "[", "[/", "[/TH", "]",
    ];

    /// The split of a whole answer, by the rules in the module's documentation.
    fn reference(opened: bool, text: &str, tags: ThinkTags) -> (String, String) {
        let thinking = if opened {
            Some(text)
        } else {
            text.trim_start_matches(|c: char| c.is_ascii_whitespace())
                .strip_prefix(tags.open)
        };
        match thinking {
            None => (String::new(), text.to_string()),
            Some(t) => match t.find(tags.close) {
                Some(at) => (
                    t[..at].to_string(),
                    t[at + tags.close.len()..].trim_start().to_string(),
                ),
                None => (t.to_string(), String::new()),
            },
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        /// However the answer is cut into tokens, the split is that of the whole answer.
        #[test]
        fn any_cut_splits_as_the_whole(
            pieces in proptest::collection::vec(0..FRAGMENTS.len(), 0..16),
            cuts in proptest::collection::vec(1usize..6, 0..16),
            opened in any::<bool>(),
            mistral in any::<bool>(),
        ) {
            let tags = if mistral { ThinkTags::MISTRAL } else { ThinkTags::XML };
            let text: String = pieces.iter().map(|&i| FRAGMENTS[i]).collect();
            let chars: Vec<char> = text.chars().collect();
            let mut s = ReasoningSplitter::new(opened, tags);
            let (mut reasoning, mut content) = (String::new(), String::new());
            let (mut at, mut cut) = (0, cuts.iter().cycle());
            while at < chars.len() {
                let n = cut.next().copied().unwrap_or(chars.len());
                let piece: String = chars[at..(at + n).min(chars.len())].iter().collect();
                at += n;
                let out = s.push(&piece);
                reasoning.push_str(&out.reasoning);
                content.push_str(&out.content);
            }
            let out = s.finish();
            reasoning.push_str(&out.reasoning);
            content.push_str(&out.content);
            prop_assert_eq!((reasoning, content), reference(opened, &text, tags), "{:?}", text);
        }
    }

    /// Feeds `text` in pieces of `step` characters; the reasoning and the answer.
    fn run(opened: bool, text: &str, step: usize) -> (String, String) {
        let mut s = ReasoningSplitter::new(opened, ThinkTags::XML);
        let chars: Vec<char> = text.chars().collect();
        let mut all = Split::default();
        for piece in chars.chunks(step) {
            let piece: String = piece.iter().collect();
            let out = s.push(&piece);
            all.reasoning.push_str(&out.reasoning);
            all.content.push_str(&out.content);
        }
        let out = s.finish();
        all.reasoning.push_str(&out.reasoning);
        all.content.push_str(&out.content);
        (all.reasoning, all.content)
    }

    #[test]
    fn thinking_at_the_start_is_reasoning_at_any_split() {
        let text = "<think>\nThe user wants 2+2. <b>4</b> < </thin no.\n</think>\n\nIt is 4.";
        for step in 1..=12 {
            let (reasoning, content) = run(false, text, step);
            assert_eq!(
                reasoning, "\nThe user wants 2+2. <b>4</b> < </thin no.\n",
                "step {step}"
            );
            assert_eq!(content, "It is 4.", "step {step}");
        }
    }

    #[test]
    fn a_prompt_that_opened_the_thinking_needs_only_the_closing_tag() {
        for step in 1..=9 {
            let (reasoning, content) = run(true, "Let me see.\n</think>\n\nYes.", step);
            assert_eq!(
                (reasoning.as_str(), content.as_str()),
                ("Let me see.\n", "Yes.")
            );
        }
        assert!(prompt_opens_thinking(
            "<|im_start|>assistant\n<think>\n",
            ThinkTags::XML
        ));
        assert!(!prompt_opens_thinking(
            "<|im_start|>assistant\n",
            ThinkTags::XML
        ));
        assert!(!prompt_opens_thinking(
            "<think>\n\n</think>\n\n",
            ThinkTags::XML
        ));
    }

    #[test]
    fn answers_without_thinking_pass_through_whole() {
        for text in ["Hello <think> there", "  <thi", "\n\nplain", "<", ""] {
            for step in 1..=4 {
                let (reasoning, content) = run(false, text, step);
                assert_eq!(reasoning, "", "{text:?}");
                assert_eq!(content, text, "{text:?} step {step}");
            }
        }
    }

    #[test]
    fn unfinished_thinking_is_all_reasoning() {
        for step in 1..=5 {
            let (reasoning, content) = run(false, "<think>still going </thi", step);
            assert_eq!(
                (reasoning.as_str(), content.as_str()),
                ("still going </thi", "")
            );
        }
        // An empty think block (Qwen 3 with thinking off writes one in the prompt, but
        // a model may write it too).
        let (reasoning, content) = run(false, "<think>\n\n</think>\n\nHi", 3);
        assert_eq!((reasoning.as_str(), content.as_str()), ("\n\n", "Hi"));
    }

    #[test]
    fn multibyte_text_is_never_cut_inside_a_character() {
        let text = "<think>é😀</é</think>ü";
        for step in 1..=4 {
            let (reasoning, content) = run(false, text, step);
            assert_eq!((reasoning.as_str(), content.as_str()), ("é😀</é", "ü"));
        }
    }

    #[test]
    fn mistral_models_think_between_their_own_tags() {
        let mut s = ReasoningSplitter::new(false, ThinkTags::MISTRAL);
        let mut out = s.push("[THINK]Two plus two.[/TH");
        let last = s.push("INK]\n4.");
        out.reasoning.push_str(&last.reasoning);
        out.content.push_str(&last.content);
        assert_eq!(
            (out.reasoning.as_str(), out.content.as_str()),
            ("Two plus two.", "4.")
        );
        // The other family's tags are text.
        let mut s = ReasoningSplitter::new(false, ThinkTags::MISTRAL);
        assert_eq!(s.push("<think>x</think>").content, "<think>x</think>");
        assert!(prompt_opens_thinking(
            "[INST]Hi[/INST][THINK]",
            ThinkTags::MISTRAL
        ));
        assert!(!prompt_opens_thinking(
            "[INST]Hi[/INST][THINK]",
            ThinkTags::XML
        ));
    }

    #[test]
    fn the_vocabulary_tells_which_tags_a_model_thinks_in() {
        let plain = Tokenizer::new(crate::text::bpe_spec("gpt-2")).expect("a vocabulary");
        assert_eq!(ThinkTags::of_vocabulary(&plain), ThinkTags::XML);
        assert!(ThinkTags::XML.control_ids(&plain).is_empty());
        let mut spec = crate::text::bpe_spec("gpt-2");
        for tag in ["[THINK]", "[/THINK]"] {
            spec.tokens.push(tag.into());
            spec.token_types.as_mut().expect("types").push(3);
        }
        let mistral = Tokenizer::new(spec).expect("a vocabulary");
        assert_eq!(ThinkTags::of_vocabulary(&mistral), ThinkTags::MISTRAL);
        let ids = ThinkTags::MISTRAL.control_ids(&mistral);
        assert_eq!(
            ids,
            [
                mistral.token_id("[THINK]").unwrap(),
                mistral.token_id("[/THINK]").unwrap()
            ]
        );
        // The stream shows them, and no other control token.
        let mut stream = crate::text::StreamDecoder::skipping_control_but(ids.clone());
        let text: String = mistral
            .encode("<|im_start|>[THINK]a[/THINK]b", false, true)
            .into_iter()
            .map(|id| stream.push(&mistral, id))
            .collect();
        assert_eq!(text, "[THINK]a[/THINK]b");
    }
}
