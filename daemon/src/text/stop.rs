//! Stop strings: generation ends before the first occurrence of any of them, and no text
//! from the stop string on is ever emitted.
//!
//! Text arrives in deltas (one per token), so a stop string may span several of them. The
//! matcher releases text as soon as it cannot be part of a stop string and holds back a
//! tail that could still grow into one.

/// What a delta lets the caller emit.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StopOutput {
    /// Text that is safe to send now.
    pub text: String,
    /// A stop string completed: `text` is everything before it, and generation ends.
    pub stopped: bool,
}

#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// KMP failure functions of `stops`.
    fail: Vec<Vec<usize>>,
    /// Text received but not yet released: a possible start of a stop string.
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        let stops = stops
            .iter()
            .map(|s| s.as_ref())
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect::<Vec<_>>();
        let fail = stops.iter().map(|s| failure(s.as_bytes())).collect();
        Self {
            stops,
            fail,
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether any stop strings are set; without any, `push` releases everything at once.
    pub fn is_active(&self) -> bool {
        !self.stops.is_empty()
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Feeds the next delta. After a stop, everything is swallowed.
    pub fn push(&mut self, delta: &str) -> StopOutput {
        if self.stopped {
            return StopOutput {
                text: String::new(),
                stopped: true,
            };
        }
        self.held.push_str(delta);

        // The earliest stop string to start in the window wins; among those starting at
        // the same place, the first completed is as good as any other.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            self.held.truncate(at);
            self.stopped = true;
            return StopOutput {
                text: std::mem::take(&mut self.held),
                stopped: true,
            };
        }

        let keep = self.longest_partial_suffix();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopOutput {
            text,
            stopped: false,
        }
    }

    /// Ends the stream for another reason (EOS, length): the held-back text was not a
    /// stop string after all and is released.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop string.
    /// A stop string never starts with a UTF-8 continuation byte, so the cut is always on
    /// a character boundary. Linear in the stop strings' lengths (KMP), so long stop
    /// strings cannot make each token quadratic.
    fn longest_partial_suffix(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for (stop, fail) in self.stops.iter().zip(&self.fail) {
            let pat = stop.as_bytes();
            // Only a suffix shorter than the stop string can matter.
            let start = held.len().saturating_sub(pat.len() - 1);
            let mut k = 0;
            for &b in &held[start..] {
                while k > 0 && (k == pat.len() || pat[k] != b) {
                    k = fail[k - 1];
                }
                if pat[k] == b {
                    k += 1;
                }
            }
            best = best.max(k.min(pat.len() - 1));
        }
        best
    }
}

/// KMP failure function: `f[i]` is the length of the longest proper prefix of
/// `pat[..=i]` that is also its suffix.
fn failure(pat: &[u8]) -> Vec<usize> {
    let mut f = vec![0; pat.len()];
    let mut k = 0;
    for i in 1..pat.len() {
        while k > 0 && pat[i] != pat[k] {
            k = f[k - 1];
        }
        if pat[i] == pat[k] {
            k += 1;
        }
        f[i] = k;
    }
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(stops: &[&str], deltas: &[&str]) -> (String, bool) {
        let mut m = StopMatcher::new(stops);
        let mut out = String::new();
        for d in deltas {
            let o = m.push(d);
            out.push_str(&o.text);
            if o.stopped {
                return (out, true);
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stops_across_delta_boundaries() {
        assert_eq!(
            run(&["</end>"], &["Hello </", "en", "d> more"]),
            ("Hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn releases_text_that_cannot_start_a_stop() {
        let mut m = StopMatcher::new(&["STOP"]);
        assert_eq!(m.push("abc S").text, "abc ");
        assert_eq!(m.push("T").text, "");
        // "STx" is no stop: all of it is released.
        assert_eq!(m.push("x").text, "STx");
        assert_eq!(m.push("yz").text, "yz");
        assert!(!m.is_stopped());
    }

    #[test]
    fn false_start_then_real_stop_in_one_delta() {
        assert_eq!(run(&["abc"], &["aab", "abcd"]), ("aab".into(), true));
        assert_eq!(run(&["abc"], &["xaabc"]), ("xa".into(), true));
    }

    #[test]
    fn nothing_leaks_after_a_stop() {
        let mut m = StopMatcher::new(&["END"]);
        let o = m.push("okEND tail");
        assert_eq!(
            o,
            StopOutput {
                text: "ok".into(),
                stopped: true
            }
        );
        assert_eq!(
            m.push("more"),
            StopOutput {
                text: String::new(),
                stopped: true
            }
        );
        assert_eq!(m.finish(), "");
    }

    #[test]
    fn earliest_stop_wins_and_held_text_is_released_at_the_end() {
        assert_eq!(
            run(&["world", "lo w"], &["hello world"]),
            ("hel".into(), true)
        );
        assert_eq!(run(&["STOP"], &["text ST"]), ("text ST".into(), false));
        assert_eq!(run(&[""], &["no stops"]), ("no stops".into(), false));
    }

    #[test]
    fn overlapping_partial_matches() {
        // "aab" is a false start for "aabaac", but its tail "a" could still begin one.
        let mut m = StopMatcher::new(&["aabaac"]);
        assert_eq!(m.push("xaabaa").text, "x");
        assert_eq!(m.push("b").text, "aab");
        assert_eq!(m.push("aac").text, "");
        assert!(m.is_stopped());
        // A long stop string is handled in linear time per delta.
        let long = "ab".repeat(50_000);
        let mut m = StopMatcher::new(&[long.as_str()]);
        for _ in 0..1000 {
            assert_eq!(m.push("ab").text, "");
        }
        assert_eq!(m.push("x").text, "ab".repeat(1000) + "x");
    }

    #[test]
    fn multibyte_stop_strings() {
        assert_eq!(run(&["😀!"], &["hi 😀", "!", "x"]), ("hi ".into(), true));
        assert_eq!(run(&["éé"], &["aé", "b"]), ("aéb".into(), false));
    }

    proptest! {
        /// However the text is cut into deltas, the output is the text up to the first
        /// stop string (or all of it).
        #[test]
        fn independent_of_delta_boundaries(text in "[ab\\n ]{0,30}", cuts in proptest::collection::vec(0usize..31, 0..8), stop in "[ab\\n ]{1,4}") {
            let mut points: Vec<usize> = cuts.into_iter().filter(|&c| c <= text.len()).collect();
            points.push(0);
            points.push(text.len());
            points.sort_unstable();
            let deltas: Vec<&str> = points.windows(2).map(|w| &text[w[0]..w[1]]).collect();
            let (out, stopped) = run(&[stop.as_str()], &deltas);
            match text.find(&stop) {
                Some(at) => prop_assert_eq!((out, stopped), (text[..at].to_string(), true)),
                None => prop_assert_eq!((out, stopped), (text.clone(), false)),
            }
        }
    }
}
