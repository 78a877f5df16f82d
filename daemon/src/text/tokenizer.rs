//! `Tokenizer`: text <-> token ids for a GGUF vocabulary, matching llama.cpp's ids.

use std::sync::OnceLock;

use super::bpe::BpeModel;
use super::constraint::ByteOrderedVocab;
use super::fxhash::FxHashMap;
use super::pretokenize::PreTokenizer;
use super::special::{self, attr, Fragment};
use super::unicode::char_to_byte;
use super::{TextError, TokenizerSpec};

/// SentencePiece's visible space.
const SPM_SPACE: char = '\u{2581}';

enum Model {
    Bpe {
        pre: PreTokenizer,
        bpe: Box<BpeModel>,
    },
    Spm {
        scores: Vec<f32>,
    },
}

/// A loaded vocabulary. Built once; shared read-only between requests (`Send + Sync`).
pub struct Tokenizer {
    model: Model,
    texts: Vec<String>,
    attrs: Vec<u8>,
    token_to_id: FxHashMap<String, u32>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<u32>,
    /// What each token decodes to, concatenated; `piece_offsets[i]..piece_offsets[i + 1]`.
    piece_bytes: Vec<u8>,
    piece_offsets: Vec<usize>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    eom: Option<u32>,
    pad: Option<u32>,
    unk: Option<u32>,
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    /// Built the first time a request asks for constrained output.
    byte_order: OnceLock<ByteOrderedVocab>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.model {
            Model::Bpe { pre, .. } => format!("gpt2/{}", pre.name()),
            Model::Spm { .. } => "llama".to_string(),
        };
        f.debug_struct("Tokenizer")
            .field("model", &kind)
            .field("vocab_size", &self.texts.len())
            .finish()
    }
}

impl Tokenizer {
    pub fn new(spec: TokenizerSpec) -> Result<Self, TextError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TextError::InvalidVocab("no tokens".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(TextError::InvalidVocab(format!(
                "{n} tokens do not fit 32-bit ids"
            )));
        }
        let named = [
            ("bos", spec.bos),
            ("eos", spec.eos),
            ("eot", spec.eot),
            ("eom", spec.eom),
            ("pad", spec.pad),
            ("unk", spec.unk),
        ];
        for (name, id) in named {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(TextError::SpecialTokenOutOfRange {
                    name,
                    id,
                    vocab_size: n,
                });
            }
        }
        if spec.add_bos && spec.bos.is_none() {
            return Err(TextError::MissingSpecialToken("BOS"));
        }
        if spec.add_eos && spec.eos.is_none() {
            return Err(TextError::MissingSpecialToken("EOS"));
        }

        let mut texts = spec.tokens;
        for (i, t) in texts.iter_mut().enumerate() {
            if t.is_empty() {
                // llama.cpp renames empty tokens so that every text maps to one id.
                *t = format!("[EMPTY_{i}]");
            }
        }
        let mut attrs = match &spec.token_types {
            Some(types) if types.len() < n => {
                return Err(TextError::InvalidVocab(format!(
                    "{} token types for {n} tokens",
                    types.len()
                )));
            }
            Some(types) => types[..n]
                .iter()
                .map(|&t| attr::from_token_type(t))
                .collect(),
            None => vec![attr::NORMAL; n],
        };
        let token_to_id: FxHashMap<String, u32> = texts
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();

        let model = match spec.model.as_str() {
            "gpt2" => {
                let pre = match spec.pre.as_deref() {
                    Some(name) => PreTokenizer::from_name(name)?,
                    None => {
                        tracing::warn!(
                            "vocabulary has no pre-tokenizer type; using llama.cpp's 'default'"
                        );
                        PreTokenizer::from_name("default")?
                    }
                };
                Model::Bpe {
                    bpe: Box::new(BpeModel::new(&token_to_id, n as u32, &spec.merges)),
                    pre,
                }
            }
            "llama" => {
                let scores = spec.scores.unwrap_or_else(|| vec![0.0; n]);
                if scores.len() < n {
                    return Err(TextError::InvalidVocab(format!(
                        "{} scores for {n} tokens",
                        scores.len()
                    )));
                }
                Model::Spm { scores }
            }
            other => return Err(TextError::UnknownModel(other.to_string())),
        };

        // llama.cpp's by-name detection: tokens found by their text become control tokens
        // (ids the file names keep their type), and some of them end generation even when
        // the file does not say so.
        let find = |names: &[&str]| names.iter().find_map(|t| token_to_id.get(*t).copied());
        let eot_by_name = spec
            .eot
            .is_none()
            .then(|| find(special::EOT_TEXTS))
            .flatten();
        let eom_by_name = spec
            .eom
            .is_none()
            .then(|| find(special::EOM_TEXTS))
            .flatten();
        let (eot, eom) = (spec.eot.or(eot_by_name), spec.eom.or(eom_by_name));
        let eog_by_name = special::EOG_TEXTS
            .iter()
            .filter_map(|t| token_to_id.get(*t).copied());
        let fim_eog: Vec<u32> = special::FIM_EOG_TEXTS
            .iter()
            .filter_map(|names| find(names))
            .collect();
        let fim_other = special::FIM_TEXTS.iter().filter_map(|names| find(names));
        let mut eog: Vec<u32> = eog_by_name.clone().chain(fim_eog.iter().copied()).collect();
        eog.extend([spec.eos, eot, eom].into_iter().flatten());
        let by_name = eog_by_name
            .chain(fim_eog)
            .chain(fim_other)
            .chain(eot_by_name)
            .chain(eom_by_name);
        for id in by_name {
            attrs[id as usize] |= attr::CONTROL;
        }
        eog.sort_unstable();
        eog.dedup();

        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        specials.sort_by_key(|&i| std::cmp::Reverse(texts[i as usize].len()));

        let mut tok = Self {
            model,
            texts,
            attrs,
            token_to_id,
            specials,
            piece_bytes: Vec::new(),
            piece_offsets: Vec::new(),
            bos: spec.bos,
            eos: spec.eos,
            eot,
            eom,
            pad: spec.pad,
            unk: spec.unk,
            eog,
            add_bos: spec.add_bos,
            add_eos: spec.add_eos,
            add_space_prefix: spec.add_space_prefix,
            byte_order: OnceLock::new(),
        };
        tok.build_pieces();
        Ok(tok)
    }

    /// Decodes every token once, like llama.cpp's piece cache.
    fn build_pieces(&mut self) {
        let mut bytes = Vec::with_capacity(self.texts.len() * 6);
        let mut offsets = Vec::with_capacity(self.texts.len() + 1);
        offsets.push(0);
        for (text, &a) in self.texts.iter().zip(&self.attrs) {
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                bytes.extend_from_slice(text.as_bytes());
            } else if a & attr::NORMAL != 0 {
                match self.model {
                    Model::Bpe { .. } => {
                        let mut buf = [0u8; 4];
                        for c in text.chars() {
                            match char_to_byte(c) {
                                Some(b) => bytes.push(b),
                                // Not in the byte alphabet: keep the char itself.
                                None => bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes()),
                            }
                        }
                    }
                    Model::Spm { .. } => {
                        bytes.extend_from_slice(text.replace(SPM_SPACE, " ").as_bytes())
                    }
                }
            } else if a & attr::BYTE != 0 {
                if let Some(b) = parse_byte_token(text) {
                    bytes.push(b);
                }
            }
            offsets.push(bytes.len());
        }
        self.piece_bytes = bytes;
        self.piece_offsets = offsets;
    }

    /// Token ids for `text`. `add_special` adds BOS/EOS as the vocabulary asks;
    /// `parse_special` turns special-token text such as `<|im_start|>` into that token
    /// (user-defined tokens are always matched, as in llama.cpp).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.fragments(text, 0..text.len(), parse_special);
        self.encode_fragments(text, &frags, add_special)
    }

    /// Token ids for a rendered chat prompt: control-token text is parsed into those
    /// tokens (the template's `<|im_start|>`...) except inside the `plain` byte ranges
    /// (text from the messages, sorted, not overlapping), where it stays text, as in
    /// `encode(.., false)`. Text on either side of a range's edge is tokenized as one.
    pub fn encode_with_plain(
        &self,
        text: &str,
        add_special: bool,
        plain: &[std::ops::Range<usize>],
    ) -> Vec<u32> {
        let mut frags = Vec::new();
        let mut at = 0;
        for range in plain {
            let (start, end) = (range.start.clamp(at, text.len()), range.end.min(text.len()));
            if start >= end {
                continue;
            }
            frags.extend(self.fragments(text, at..start, true));
            frags.extend(self.fragments(text, start..end, false));
            at = end;
        }
        frags.extend(self.fragments(text, at..text.len(), true));
        // Neighbouring text pieces become one, so a range's edge changes no merge.
        let mut merged: Vec<Fragment> = Vec::with_capacity(frags.len());
        for frag in frags {
            match (merged.last_mut(), frag) {
                (Some(Fragment::Text(last)), Fragment::Text(next)) if last.end == next.start => {
                    last.end = next.end;
                }
                (_, frag) => merged.push(frag),
            }
        }
        self.encode_fragments(text, &merged, add_special)
    }

    /// Byte ranges of `text` that `encode(text, _, true)` reads as control tokens and
    /// `encode(text, _, false)` leaves as text.
    pub fn control_text_ranges(&self, text: &str) -> Vec<std::ops::Range<usize>> {
        let controls = self
            .specials
            .iter()
            .copied()
            .filter(|&id| self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) != 0);
        let frags = special::partition(
            text,
            controls.map(|id| (id, self.texts[id as usize].as_str())),
        );
        let mut ranges = Vec::new();
        let mut at = 0;
        for frag in frags {
            match frag {
                Fragment::Text(range) => at = range.end,
                Fragment::Token(id) => {
                    let end = at + self.texts[id as usize].len();
                    ranges.push(at..end);
                    at = end;
                }
            }
        }
        ranges
    }

    /// `text[range]` split around special-token text, in ranges of `text`.
    fn fragments(
        &self,
        text: &str,
        range: std::ops::Range<usize>,
        parse_special: bool,
    ) -> Vec<Fragment> {
        let specials = self.specials.iter().copied().filter(|&id| {
            parse_special || self.attrs[id as usize] & (attr::CONTROL | attr::UNKNOWN) == 0
        });
        let offset = range.start;
        let mut frags = special::partition(
            &text[range],
            specials.map(|id| (id, self.texts[id as usize].as_str())),
        );
        for frag in &mut frags {
            if let Fragment::Text(r) = frag {
                *r = r.start + offset..r.end + offset;
            }
        }
        frags
    }

    /// Ids for `text` split into `frags`.
    fn encode_fragments(&self, text: &str, frags: &[Fragment], add_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            out.extend(self.bos);
        }
        match &self.model {
            Model::Bpe { pre, bpe } => {
                for frag in frags {
                    match frag {
                        Fragment::Token(id) => out.push(*id),
                        Fragment::Text(range) => {
                            self.encode_bpe(&text[range.clone()], pre, bpe, &mut out)
                        }
                    }
                }
            }
            Model::Spm { scores } => {
                let mut prev_special = true;
                for frag in frags {
                    match frag {
                        Fragment::Token(id) => {
                            out.push(*id);
                            prev_special = true;
                        }
                        Fragment::Text(range) => {
                            let mut s = String::with_capacity(range.len() + 3);
                            if self.add_space_prefix && prev_special {
                                s.push(' ');
                            }
                            s.push_str(&text[range.clone()]);
                            let escaped = s.replace(' ', "\u{2581}");
                            super::spm::encode(
                                &escaped,
                                &self.token_to_id,
                                scores,
                                |b| self.byte_token(b),
                                &mut out,
                            );
                            prev_special = false;
                        }
                    }
                }
            }
        }
        if add_special && self.add_eos {
            out.extend(self.eos);
        }
        out
    }

    fn encode_bpe(&self, text: &str, pre: &PreTokenizer, bpe: &BpeModel, out: &mut Vec<u32>) {
        for range in pre.split(text) {
            let word = &text.as_bytes()[range];
            if pre.ignore_merges() {
                if let Some(&id) = self.token_to_id.get(&bpe.byte_encode(word)) {
                    out.push(id);
                    continue;
                }
            }
            bpe.encode_word(word, out);
        }
    }

    /// SentencePiece byte fallback: `<0xXX>`, else a token that is the byte itself, else
    /// the unknown token (llama.cpp aborts here; a prompt must not crash the daemon).
    fn byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        self.token_to_id
            .get(&hex)
            .or_else(|| {
                b.is_ascii()
                    .then(|| self.token_to_id.get(&char::from(b).to_string()))
                    .flatten()
            })
            .copied()
            .or(self.unk)
    }

    /// Text for `ids`, special tokens included as their text. Invalid UTF-8 (a token
    /// sequence that ends mid-character) becomes U+FFFD; nothing else is altered.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            bytes.extend_from_slice(self.token_bytes(id));
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The raw bytes token `id` stands for (empty for ids outside the vocabulary and for
    /// unused tokens). May be part of a UTF-8 character.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.piece_offsets.get(i), self.piece_offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.piece_bytes[a..b],
            _ => &[],
        }
    }

    /// The token's decoded text for display (lossy when it is part of a character).
    pub fn piece(&self, id: u32) -> String {
        String::from_utf8_lossy(self.token_bytes(id)).into_owned()
    }

    /// The token's text as stored in the vocabulary (e.g. `Ġhello`, `<|im_end|>`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    pub fn vocab_size(&self) -> usize {
        self.texts.len()
    }
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.eom
    }
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// SentencePiece vocabularies that prefix a space: decoded text keeps that space.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix && matches!(self.model, Model::Spm { .. })
    }

    /// Whether generating `id` ends the generation: EOS, EOT, EOM, and the tokens llama.cpp
    /// recognises by name (`<|im_end|>`, `<|endoftext|>`, `<|eot_id|>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// The text tokens in byte order, for constrained output's mask (built on first use:
    /// sorting a 150k vocabulary takes some 30 ms).
    pub fn byte_ordered_vocab(&self) -> &ByteOrderedVocab {
        self.byte_order.get_or_init(|| ByteOrderedVocab::new(self))
    }

    /// Whether `id` is a control token (BOS, `<|im_start|>`, ...), which a client usually
    /// does not want to see in generated text.
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|a| a & attr::CONTROL != 0)
    }
}

fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2)
        .then(|| u8::from_str_radix(hex, 16).ok())
        .flatten()
}

#[cfg(test)]
#[path = "tokenizer_tests.rs"]
pub(crate) mod tests;
