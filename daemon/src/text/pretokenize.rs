//! Pre-tokenizers: split text into words before byte-level BPE, exactly as llama.cpp does.
//!
//! llama.cpp applies a list of split "regexes" in turn; each one re-splits every piece the
//! previous one produced, keeping both matches and the text between them. The common
//! regexes (GPT-2, Llama 3, Qwen 2) are hand-written state machines there, and so they
//! are here: their quirks (e.g. how a lone space before punctuation is attached) are part
//! of what the model was trained on. The few remaining regexes are simple character-class
//! rules, written by hand against llama.cpp's "collapsed" category semantics.

use super::unicode::Flags;
use super::TextError;

/// One split rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// `(?i:'s|…)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Llama3,
    /// Llama 3's rule with single digits (`\p{N}` instead of `\p{N}{1,3}`).
    Qwen2,
    /// Mistral's Tekken, as llama.cpp rewrites it for its collapsed text (an upper-case
    /// letter is any letter but `a-z`, a lower-case one any letter but `A-Z`):
    /// `[^\r\n\p{L}\p{N}]?Up*Lo+|[^\r\n\p{L}\p{N}]?Up+Lo*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    Tekken,
    /// `\p{N}`: every number code point on its own.
    EachNumber,
    /// `\p{N}+`: runs of numbers.
    NumberRuns,
    /// `[0-9][0-9][0-9]`: ASCII digits in threes from the left.
    AsciiDigitTriples,
    /// `[\p{P}\$\+<=>\^~\|]+`: runs of punctuation and a few ASCII symbols.
    PunctuationRuns,
}

/// How a vocabulary's text is split into words (`tokenizer.ggml.pre`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreTokenizer {
    name: String,
    rules: &'static [Rule],
    /// llama.cpp's `ignore_merges`: a word that is itself a token is emitted whole.
    ignore_merges: bool,
    /// Whether llama.cpp adds BOS for this pre-tokenizer when the file does not say.
    default_add_bos: bool,
}

impl PreTokenizer {
    /// The pre-tokenizer llama.cpp uses for `name`. Names it maps to splitters we do not
    /// implement are refused, never approximated: a wrong split silently changes every
    /// token id the model sees.
    pub fn from_name(name: &str) -> Result<Self, TextError> {
        use Rule::*;
        let (rules, ignore_merges, default_add_bos): (&'static [Rule], bool, bool) = match name {
            "default" => (
                &[PunctuationRuns, Gpt2, NumberRuns, AsciiDigitTriples],
                false,
                false,
            ),
            "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de" | "jina-v2-es"
            | "jina-v2-de" | "gigachat" | "a.x-4.0" | "mellum" | "exaone4" | "trillion"
            | "granite-docling" => (&[Gpt2], false, false),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => (&[EachNumber, Gpt2], false, false),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" => (&[Llama3], true, true),
            "dbrx" | "smaug-bpe" => (&[Llama3], false, false),
            "tekken" => (&[Tekken], true, true),
            "qwen2" | "deepseek-r1-qwen" | "megrez" | "stablelm2" | "hunyuan" | "solar-open" => {
                (&[Qwen2], false, false)
            }
            other => return Err(TextError::UnknownPreTokenizer(other.to_string())),
        };
        Ok(Self {
            name: name.to_string(),
            rules,
            ignore_merges,
            default_add_bos,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn ignore_merges(&self) -> bool {
        self.ignore_merges
    }

    pub fn default_add_bos(&self) -> bool {
        self.default_add_bos
    }

    /// Splits `text` into words, returned as byte ranges that tile `text`.
    pub fn split(&self, text: &str) -> Vec<std::ops::Range<usize>> {
        let (chars, byte_starts): (Vec<char>, Vec<usize>) =
            text.char_indices().map(|(i, c)| (c, i)).unzip();
        let mut pieces = if chars.is_empty() {
            Vec::new()
        } else {
            vec![chars.len()]
        };
        for &rule in self.rules {
            pieces = apply(rule, &chars, &pieces);
        }
        let mut out = Vec::with_capacity(pieces.len());
        let mut at = 0usize;
        for len in pieces {
            let start = byte_starts[at];
            at += len;
            let end = byte_starts.get(at).copied().unwrap_or(text.len());
            out.push(start..end);
        }
        out
    }
}

/// Re-splits each piece (given as code point lengths) with `rule`.
fn apply(rule: Rule, cps: &[char], pieces: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len() * 2);
    let mut start = 0;
    for &len in pieces {
        let frag = Fragment {
            cps,
            start,
            end: start + len,
        };
        match rule {
            Rule::Gpt2 => split_gpt2(&frag, &mut out),
            Rule::Llama3 => split_llama3(&frag, &mut out, Some(3)),
            Rule::Qwen2 => split_llama3(&frag, &mut out, Some(1)),
            Rule::Tekken => split_tekken(&frag, &mut out),
            Rule::EachNumber => split_class(&frag, &mut out, is_collapsed_number, false),
            Rule::NumberRuns => split_class(&frag, &mut out, is_collapsed_number, true),
            Rule::PunctuationRuns => split_class(&frag, &mut out, is_punctuation_run_char, true),
            Rule::AsciiDigitTriples => split_ascii_digit_triples(&frag, &mut out),
        }
        start += len;
    }
    out
}

/// A piece being split: code points `start..end` of `cps`. Lookups past `end` see nothing,
/// as in llama.cpp, so a rule never looks across piece boundaries.
struct Fragment<'a> {
    cps: &'a [char],
    start: usize,
    end: usize,
}

impl Fragment<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (pos < self.end).then(|| self.cps[pos])
    }
    fn flags(&self, pos: usize) -> Flags {
        self.cpt(pos).map_or(Flags::NONE, Flags::of)
    }
}

/// Emits pieces ending at given positions; mirrors llama.cpp's `_add_token`.
struct Emitter<'o> {
    out: &'o mut Vec<usize>,
    prev_end: usize,
}

impl Emitter<'_> {
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

/// `'s|'t|'re|'ve|'m|'ll|'d` (with ASCII case folding when `fold`): the length matched at `pos`.
fn contraction(f: &Fragment, pos: usize, fold: bool) -> Option<usize> {
    if f.cpt(pos) != Some('\'') || pos + 1 >= f.end {
        return None;
    }
    let lower = |c: Option<char>| c.map(|c| if fold { c.to_ascii_lowercase() } else { c });
    let next = lower(f.cpt(pos + 1));
    if matches!(next, Some('s' | 't' | 'm' | 'd')) {
        return Some(2);
    }
    if pos + 2 < f.end {
        let pair = (next, lower(f.cpt(pos + 2)));
        if matches!(
            pair,
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
        ) {
            return Some(3);
        }
    }
    None
}

fn is_symbol_run(fl: Flags) -> bool {
    !(fl.is_whitespace() || fl.is_letter() || fl.is_number() || fl.is_none())
}

/// Port of llama.cpp's `unicode_regex_split_custom_gpt2`.
fn split_gpt2(f: &Fragment, out: &mut Vec<usize>) {
    let mut em = Emitter {
        out,
        prev_end: f.start,
    };
    let mut pos = f.start;
    while pos < f.end {
        let cpt = f.cps[pos];
        let flags = Flags::of(cpt);
        if let Some(n) = contraction(f, pos, false) {
            pos += em.add(pos + n);
            continue;
        }
        let space = usize::from(cpt == ' ');
        let mut flags2 = if cpt == ' ' { f.flags(pos + 1) } else { flags };
        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`
        let classes: [fn(Flags) -> bool; 3] = [Flags::is_letter, Flags::is_number, is_symbol_run];
        if let Some(class) = classes.into_iter().find(|class| class(flags2)) {
            pos += space;
            while class(flags2) {
                pos += 1;
                flags2 = f.flags(pos);
            }
            em.add(pos);
            continue;
        }
        pos = whitespace_tail(f, pos, &mut em, false);
    }
}

/// Port of llama.cpp's `unicode_regex_split_custom_llama3` (`max_digits` 3) and
/// `unicode_regex_split_custom_qwen2` (`max_digits` 1).
fn split_llama3(f: &Fragment, out: &mut Vec<usize>, max_digits: Option<usize>) {
    let max_digits = max_digits.unwrap_or(usize::MAX);
    let mut em = Emitter {
        out,
        prev_end: f.start,
    };
    let mut pos = f.start;
    while pos < f.end {
        let cpt = f.cps[pos];
        let flags = Flags::of(cpt);
        if let Some(n) = contraction(f, pos, true) {
            pos += em.add(pos + n);
            continue;
        }
        // `[^\r\n\p{L}\p{N}]?\p{L}+`
        if !(cpt == '\r' || cpt == '\n' || flags.is_number())
            && (flags.is_letter() || f.flags(pos + 1).is_letter())
        {
            pos += 1;
            while f.flags(pos).is_letter() {
                pos += 1;
            }
            em.add(pos);
            continue;
        }
        // `\p{N}{1,max}`
        if flags.is_number() {
            let mut ini = pos;
            while f.flags(pos).is_number() {
                pos += 1;
                if pos - ini >= max_digits {
                    em.add(pos);
                    ini = pos;
                }
            }
            em.add(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n]*` (llama.cpp tests the first char's own flags here)
        let mut flags2 = if cpt == ' ' { f.flags(pos + 1) } else { flags };
        if !(flags2.is_whitespace() || flags2.is_letter() || flags2.is_number() || flags.is_none())
        {
            pos += usize::from(cpt == ' ');
            while is_symbol_run(flags2) {
                pos += 1;
                flags2 = f.flags(pos);
            }
            while matches!(f.cpt(pos), Some('\r' | '\n')) {
                pos += 1;
            }
            em.add(pos);
            continue;
        }
        pos = whitespace_tail(f, pos, &mut em, true);
    }
}

/// Mistral's Tekken split. llama.cpp has no hand-written splitter for it: it runs its
/// rewrite of the regex through `std::regex` on the collapsed text, where every non-ASCII
/// letter is one byte that is neither `a-z` nor `A-Z`, so such a letter counts as upper
/// and as lower case. These are that regex's alternatives in order, with its
/// backtracking worked out: in `Up*Lo+`, `Up*` gives back letters until a lower-case one
/// can follow (so `ÉCOLE` splits as `É` + `COLE`, where Mistral's own regex keeps it
/// whole; llama.cpp's split is what sparkd follows).
fn split_tekken(f: &Fragment, out: &mut Vec<usize>) {
    let ws = |pos: usize| f.flags(pos).is_whitespace();
    let letter = |pos: usize| {
        let fl = f.flags(pos);
        fl.is_letter() && !fl.is_whitespace()
    };
    let number = |pos: usize| f.cpt(pos).is_some_and(is_collapsed_number);
    let upper = |pos: usize| letter(pos) && !f.cpt(pos).is_some_and(|c| c.is_ascii_lowercase());
    let lower = |pos: usize| letter(pos) && !f.cpt(pos).is_some_and(|c| c.is_ascii_uppercase());
    let mut em = Emitter {
        out,
        prev_end: f.start,
    };
    let mut pos = f.start;
    while pos < f.end {
        let cpt = f.cps[pos];
        // The optional `[^\r\n\p{L}\p{N}]` before a word.
        let prefix = !(cpt == '\r' || cpt == '\n' || letter(pos) || number(pos));
        let word = pos + usize::from(prefix);
        let mut ups = word;
        while upper(ups) {
            ups += 1;
        }
        // `Up*Lo+`: the longest run of upper-case letters after which a lower-case one
        // stands, then all the lower-case letters from there.
        let lower_from = if lower(ups) {
            Some(ups)
        } else {
            (word..ups).rev().find(|&k| lower(k))
        };
        if let Some(mut end) = lower_from {
            while lower(end) {
                end += 1;
            }
            pos = end;
            em.add(pos);
            continue;
        }
        // `Up+Lo*` (`Lo*` is empty here: no lower-case letter follows the run).
        if ups > word {
            pos = ups;
            em.add(pos);
            continue;
        }
        // `\p{N}`
        if number(pos) {
            pos += 1;
            em.add(pos);
            continue;
        }
        // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
        let symbol = |p: usize| f.cpt(p).is_some() && !(ws(p) || letter(p) || number(p));
        let from = pos + usize::from(cpt == ' ' && symbol(pos + 1));
        if symbol(from) {
            pos = from;
            while symbol(pos) {
                pos += 1;
            }
            while matches!(f.cpt(pos), Some('\r' | '\n' | '/')) {
                pos += 1;
            }
            em.add(pos);
            continue;
        }
        pos = whitespace_tail(f, pos, &mut em, true);
    }
}

/// The whitespace alternatives shared by the hand-written rules: `\s*[\r\n]+` (only when
/// `newline_runs`), `\s+(?!\S)`, `\s+`, and finally "no match": one code point alone.
fn whitespace_tail(f: &Fragment, mut pos: usize, em: &mut Emitter, newline_runs: bool) -> usize {
    let mut n = 0;
    let mut last_newline_end = None;
    while f.flags(pos + n).is_whitespace() {
        if matches!(f.cpt(pos + n), Some('\r' | '\n')) {
            last_newline_end = Some(pos + n + 1);
        }
        n += 1;
    }
    if newline_runs {
        if let Some(end) = last_newline_end {
            em.add(end);
            return end;
        }
    }
    if n > 1 && f.cpt(pos + n).is_some() {
        // Leave the last space to prefix the following word.
        pos += n - 1;
    } else if n > 0 {
        pos += n;
    } else {
        pos += 1;
    }
    em.add(pos);
    pos
}

/// `\p{N}` after llama.cpp collapses the text: ASCII digits, or a non-ASCII number.
fn is_collapsed_number(c: char) -> bool {
    if c.is_ascii() {
        return c.is_ascii_digit();
    }
    let fl = Flags::of(c);
    fl.is_number() && !fl.is_whitespace()
}

/// `[\p{P}\$\+<=>\^~\|]` after collapsing: ASCII punctuation as listed in llama.cpp's
/// `k_ucat_map` (which leaves out the backtick) plus the named symbols, or any non-ASCII
/// punctuation.
fn is_punctuation_run_char(c: char) -> bool {
    if c.is_ascii() {
        return "!\"#%&'()*,-./:;?@[\\]_{}$+<=>^~|".contains(c);
    }
    let fl = Flags::of(c);
    fl.is_punctuation() && !fl.is_whitespace()
}

/// Splits a fragment into matches of a one-char class (each char alone, or maximal runs
/// when `runs`) and the text between them.
fn split_class(f: &Fragment, out: &mut Vec<usize>, class: fn(char) -> bool, runs: bool) {
    let mut em = Emitter {
        out,
        prev_end: f.start,
    };
    let mut pos = f.start;
    while pos < f.end {
        if class(f.cps[pos]) {
            em.add(pos);
            pos += 1;
            while runs && pos < f.end && class(f.cps[pos]) {
                pos += 1;
            }
            em.add(pos);
        } else {
            pos += 1;
        }
    }
    em.add(f.end);
}

fn split_ascii_digit_triples(f: &Fragment, out: &mut Vec<usize>) {
    let mut em = Emitter {
        out,
        prev_end: f.start,
    };
    let mut pos = f.start;
    while pos < f.end {
        if pos + 3 <= f.end && f.cps[pos..pos + 3].iter().all(char::is_ascii_digit) {
            em.add(pos);
            pos += 3;
            em.add(pos);
        } else {
            pos += 1;
        }
    }
    em.add(f.end);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let p = PreTokenizer::from_name(pre).expect("known pre-tokenizer");
        p.split(text)
            .into_iter()
            .map(|r| text[r].to_string())
            .collect()
    }

    #[test]
    fn unknown_pre_tokenizer_is_named() {
        let err = PreTokenizer::from_name("bloom").unwrap_err();
        assert!(err.to_string().contains("bloom"), "{err}");
    }

    #[test]
    fn gpt2_splits_words_contractions_and_spaces() {
        assert_eq!(words("gpt-2", "Hello world"), ["Hello", " world"]);
        assert_eq!(words("gpt-2", "I'm here"), ["I", "'m", " here"]);
        assert_eq!(words("gpt-2", "a   b"), ["a", "  ", " b"]);
        assert_eq!(words("gpt-2", "a  "), ["a", "  "]);
        assert_eq!(words("gpt-2", "x 123!?"), ["x", " 123", "!?"]);
        // `\s+(?!\S)` leaves the last newline to stand alone before the word.
        assert_eq!(words("gpt-2", "\n\nfoo"), ["\n", "\n", "foo"]);
    }

    #[test]
    fn smollm_isolates_digits() {
        assert_eq!(
            words("smollm", "year 2024."),
            ["year", " ", "2", "0", "2", "4", "."]
        );
        assert_eq!(words("smollm", "٣4"), ["٣", "4"]);
    }

    #[test]
    fn llama3_groups_digits_in_threes_and_keeps_newline_runs() {
        assert_eq!(words("llama-bpe", "1234567"), ["123", "456", "7"]);
        assert_eq!(
            words("llama-bpe", "Hi!\n\n  there"),
            ["Hi", "!\n\n", " ", " there"]
        );
        assert_eq!(words("llama-bpe", "DON'T"), ["DON", "'T"]);
        assert_eq!(words("llama-bpe", "a \n b"), ["a", " \n", " b"]);
    }

    #[test]
    fn qwen2_splits_single_digits() {
        assert_eq!(words("qwen2", "v12"), ["v", "1", "2"]);
        assert_eq!(words("qwen2", "(hello)"), ["(hello", ")"]);
    }

    #[test]
    fn tekken_splits_on_case_single_digits_and_symbol_runs() {
        let w = |t| words("tekken", t);
        assert_eq!(w("HelloWorld again"), ["Hello", "World", " again"]);
        assert_eq!(w("NASA's JSONParser"), ["NASA", "'s", " JSONParser"]);
        assert_eq!(w("v12.5"), ["v", "1", "2", ".", "5"]);
        assert_eq!(w("a //b\n/x"), ["a", " //", "b", "\n", "/x"]);
        assert_eq!(w("x!!\n/\ny"), ["x", "!!\n/\n", "y"]);
        assert_eq!(w("Hi\n\n  there  "), ["Hi", "\n\n", " ", " there", "  "]);
        // Non-ASCII letters are upper and lower case at once (llama.cpp's collapse).
        assert_eq!(w("ÉCOLE école"), ["É", "COLE", " école"]);
        assert_eq!(w("HelloÉcole"), ["HelloÉcole"]);
        assert_eq!(w("日本語です"), ["日本語です"]);
        assert_eq!(w("\tTab"), ["\tTab"]);
    }

    #[test]
    fn default_splits_punctuation_numbers_and_digit_triples() {
        assert_eq!(
            words("default", "a+b=12345"),
            ["a", "+", "b", "=", "123", "45"]
        );
        assert_eq!(words("default", "x `y`"), ["x", " `", "y", "`"]);
    }

    #[test]
    fn pieces_tile_the_input() {
        let text = "Ünïcödé 中文 😀👩‍👩‍👧 \t\r\n  end 42's";
        for pre in ["default", "gpt-2", "smollm", "llama-bpe", "qwen2", "tekken"] {
            let p = PreTokenizer::from_name(pre).unwrap();
            let joined: String = p.split(text).into_iter().map(|r| &text[r]).collect();
            assert_eq!(joined, text, "{pre}");
        }
        assert!(PreTokenizer::from_name("gpt-2")
            .unwrap()
            .split("")
            .is_empty());
    }
}
