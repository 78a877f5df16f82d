//! Numbers under a schema: `integer`, and `minimum`/`maximum` and their exclusive
//! forms, checked on every prefix so that a number is refused at the first digit after
//! which no completion could fall within the bounds.

/// The values a number may take: `lo..hi`, each end open (`strict`) or closed, and
/// infinite when unbounded. For an integer node both ends are closed integers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    pub lo: f64,
    pub lo_strict: bool,
    pub hi: f64,
    pub hi_strict: bool,
}

impl Bounds {
    pub const ANY: Bounds = Bounds {
        lo: f64::NEG_INFINITY,
        lo_strict: false,
        hi: f64::INFINITY,
        hi_strict: false,
    };

    pub fn is_bounded(&self) -> bool {
        *self != Self::ANY
    }

    /// The same bounds as closed integer ends; `None` when no integer is within.
    pub fn to_integers(self) -> Option<Bounds> {
        let lo = if self.lo_strict {
            self.lo.floor() + 1.0
        } else {
            self.lo.ceil()
        };
        let hi = if self.hi_strict {
            self.hi.ceil() - 1.0
        } else {
            self.hi.floor()
        };
        (lo <= hi).then_some(Bounds {
            lo,
            lo_strict: false,
            hi,
            hi_strict: false,
        })
    }

    /// Whether any value is within.
    pub fn is_empty(&self) -> bool {
        !Interval::closed(self.lo, self.hi).meets(self)
    }

    pub fn contains(&self, v: f64) -> bool {
        Interval::closed(v, v).meets(self)
    }
}

/// `lo..hi` with each end open or closed.
#[derive(Debug, Clone, Copy)]
struct Interval {
    lo: f64,
    lo_closed: bool,
    hi: f64,
    hi_closed: bool,
}

impl Interval {
    fn closed(lo: f64, hi: f64) -> Self {
        Self {
            lo,
            lo_closed: true,
            hi,
            hi_closed: true,
        }
    }

    /// `lo..hi`, the upper end open.
    fn half_open(lo: f64, hi: f64) -> Self {
        Self {
            hi_closed: false,
            ..Self::closed(lo, hi)
        }
    }

    fn negated(self) -> Self {
        Self {
            lo: -self.hi,
            lo_closed: self.hi_closed,
            hi: -self.lo,
            hi_closed: self.lo_closed,
        }
    }

    /// Whether some value is in both.
    fn meets(&self, b: &Bounds) -> bool {
        // Plain comparisons: -0 and 0 are the same number here (no end is NaN).
        let (lo, lo_closed) = if self.lo > b.lo {
            (self.lo, self.lo_closed)
        } else if self.lo < b.lo {
            (b.lo, !b.lo_strict)
        } else {
            (self.lo, self.lo_closed && !b.lo_strict)
        };
        let (hi, hi_closed) = if self.hi < b.hi {
            (self.hi, self.hi_closed)
        } else if self.hi > b.hi {
            (b.hi, !b.hi_strict)
        } else {
            (self.hi, self.hi_closed && !b.hi_strict)
        };
        lo < hi || (lo == hi && lo_closed && hi_closed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing yet.
    Start,
    /// After `-`.
    Sign,
    /// After a leading `0`.
    Zero,
    /// In the integer part, after a non-zero first digit.
    Int,
    /// After the point.
    Dot,
    /// In the fraction.
    Frac,
    /// In the exponent (only where nothing is checked).
    Exp,
}

/// A number read so far (its syntax is [`JsonAcceptor`](crate::text::json::JsonAcceptor)'s
/// to check), with what it can still become.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NumberProgress {
    phase: Phase,
    negative: bool,
    /// The integer part's value.
    int: f64,
    /// The fraction's value, and the place value of its last digit.
    frac: f64,
    place: f64,
}

impl NumberProgress {
    pub const fn new() -> Self {
        Self {
            phase: Phase::Start,
            negative: false,
            int: 0.0,
            frac: 0.0,
            place: 1.0,
        }
    }

    /// Takes the number's next byte (which the syntax allows); false when no number
    /// that starts with the bytes so far is an `integer` (when asked) within `bounds`.
    /// An exponent is refused for integers and bounded numbers: `1e2` is a fine
    /// integer, but a model has no need of it, and bounds on a mantissa and an exponent
    /// together are not worth their code.
    pub fn feed(&mut self, b: u8, integer: bool, bounds: &Bounds) -> bool {
        let checked = integer || bounds.is_bounded();
        match (self.phase, b) {
            (_, b'e' | b'E') if checked => return false,
            (Phase::Exp, _) | (_, b'e' | b'E') => {
                self.phase = Phase::Exp;
                return true;
            }
            (Phase::Start, b'-') => {
                self.negative = true;
                self.phase = Phase::Sign;
            }
            (Phase::Start | Phase::Sign, b'0') => self.phase = Phase::Zero,
            (Phase::Start | Phase::Sign | Phase::Int, b'0'..=b'9') => {
                self.int = self.int * 10.0 + f64::from(b - b'0');
                self.phase = Phase::Int;
            }
            (Phase::Zero | Phase::Int, b'.') if integer => return false,
            (Phase::Zero | Phase::Int, b'.') => self.phase = Phase::Dot,
            (Phase::Dot | Phase::Frac, b'0'..=b'9') => {
                self.place /= 10.0;
                self.frac += f64::from(b - b'0') * self.place;
                self.phase = Phase::Frac;
            }
            // The syntax was checked first: nothing else reaches here.
            _ => return false,
        }
        !checked || self.can_reach(integer, bounds)
    }

    /// Whether some number that starts with what was read is within `bounds`.
    fn can_reach(&self, integer: bool, bounds: &Bounds) -> bool {
        let p = self.int;
        // The magnitudes still reachable, as the number is or with more fraction
        // digits.
        let magnitudes = match self.phase {
            Phase::Start | Phase::Exp => return true,
            Phase::Int => return self.int_can_reach(integer, bounds),
            Phase::Sign => Interval::closed(0.0, f64::INFINITY),
            Phase::Zero if integer => Interval::closed(0.0, 0.0),
            Phase::Zero | Phase::Dot => Interval::half_open(p, p + 1.0),
            Phase::Frac => {
                let v = p + self.frac;
                Interval::half_open(v, v + self.place)
            }
        };
        if self.negative {
            magnitudes.negated().meets(bounds)
        } else {
            magnitudes.meets(bounds)
        }
    }

    /// [`Self::can_reach`] in the integer part: with `k` more integer digits the
    /// magnitude is in `p·10^k .. (p+1)·10^k`, for each `k` until that passes the
    /// bounds.
    fn int_can_reach(&self, integer: bool, bounds: &Bounds) -> bool {
        let p = self.int;
        let mut scale = 1.0f64;
        // 10^k past 10^308 is infinite; the syntax stops a number there anyway.
        for _ in 0..=310 {
            let (lo, hi) = (p * scale, (p + 1.0) * scale);
            let magnitudes = match (integer, scale == 1.0) {
                (true, true) => Interval::closed(p, p),
                (true, false) => Interval::closed(lo, hi - 1.0),
                (false, _) => Interval::half_open(lo, hi),
            };
            let values = if self.negative {
                magnitudes.negated()
            } else {
                magnitudes
            };
            if values.meets(bounds) {
                return true;
            }
            let past = if self.negative {
                -lo < bounds.lo
            } else {
                lo > bounds.hi
            };
            if past || lo.is_infinite() {
                return false;
            }
            scale *= 10.0;
        }
        false
    }

    /// The number's value (read whole).
    pub fn value(&self) -> f64 {
        let v = self.int + self.frac;
        if self.negative {
            -v
        } else {
            v
        }
    }

    /// Whether the whole number (ended here) is within `bounds`; a number with an
    /// exponent is only ever read where nothing is checked.
    pub fn ends_within(&self, bounds: &Bounds) -> bool {
        self.phase == Phase::Exp || bounds.contains(self.value())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds(lo: f64, lo_strict: bool, hi: f64, hi_strict: bool) -> Bounds {
        Bounds {
            lo,
            lo_strict,
            hi,
            hi_strict,
        }
    }

    /// Feeds `text` whole; `Some(ends within)` when every prefix was allowed.
    fn read(text: &str, integer: bool, b: &Bounds) -> Option<bool> {
        let mut n = NumberProgress::new();
        text.bytes()
            .all(|c| n.feed(c, integer, b))
            .then(|| n.ends_within(b))
    }

    /// Every number of the form `[-]d{1,3}[.d{1,2}]` below 300, as text.
    fn small_numbers() -> Vec<String> {
        let mut out = Vec::new();
        for int in 0..300 {
            for sign in ["", "-"] {
                out.push(format!("{sign}{int}"));
                for frac in 0..10 {
                    out.push(format!("{sign}{int}.{frac}"));
                }
                for frac in 0..100 {
                    out.push(format!("{sign}{int}.{frac:02}"));
                }
            }
        }
        out
    }

    /// A prefix is allowed exactly when some number that starts with it is within the
    /// bounds: brute force over a sample that holds every short number, for bounds
    /// with open, closed, fractional and negative ends.
    #[test]
    fn a_prefix_is_allowed_exactly_when_a_completion_is_within() {
        let all = small_numbers();
        for (integer, b) in [
            (false, bounds(2.5, false, 17.0, true)),
            (false, bounds(-3.25, true, 0.0, false)),
            (false, bounds(0.0, true, f64::INFINITY, false)),
            (false, bounds(f64::NEG_INFINITY, false, -10.5, false)),
            (false, bounds(99.0, false, 99.0, false)),
            (true, bounds(5.0, false, 120.0, false)),
            (true, bounds(-20.0, false, -3.0, false)),
            (true, bounds(0.0, false, 0.0, false)),
        ] {
            let within = |t: &String| {
                let v: f64 = t.parse().unwrap();
                (!integer || !t.contains('.')) && b.contains(v)
            };
            let mut reachable = std::collections::HashSet::new();
            for text in all.iter().filter(|t| within(t)) {
                for end in 1..=text.len() {
                    reachable.insert(&text[..end]);
                }
            }
            for text in &all {
                assert_eq!(
                    read(text, integer, &b) == Some(true),
                    within(text),
                    "{text} in {b:?}"
                );
                for end in 1..text.len() {
                    let prefix = &text[..end];
                    let mut n = NumberProgress::new();
                    let allowed = prefix.bytes().all(|c| n.feed(c, integer, &b));
                    if reachable.contains(prefix) {
                        assert!(allowed, "{prefix} refused, but {b:?} has a completion");
                    } else if allowed {
                        // Allowed without a completion in the sample: only a longer
                        // number (more integer digits, past the sample) is within.
                        assert!(
                            b.hi >= 300.0 || b.lo <= -300.0,
                            "{prefix} allowed in {b:?} with no completion"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn integers_refuse_a_point_and_exponents_go_only_where_nothing_is_checked() {
        assert_eq!(read("12", true, &Bounds::ANY), Some(true));
        assert_eq!(read("1.0", true, &Bounds::ANY), None);
        assert_eq!(read("1e5", true, &Bounds::ANY), None);
        assert_eq!(read("1.5e-3", false, &Bounds::ANY), Some(true));
        assert_eq!(read("1e2", false, &bounds(0.0, false, 1e3, false)), None);
    }

    #[test]
    fn integer_bounds_round_inwards() {
        let b = bounds(1.5, false, 4.0, true).to_integers().unwrap();
        assert_eq!((b.lo, b.hi), (2.0, 3.0));
        let b = bounds(2.0, true, 2.5, false).to_integers();
        assert!(b.is_none());
        assert!(bounds(1.0, true, 1.0, false).is_empty());
        assert!(!bounds(1.0, false, 1.0, false).is_empty());
    }

    #[test]
    fn negative_zero_is_zero() {
        let positive = bounds(0.0, true, f64::INFINITY, false);
        assert_eq!(read("-0", false, &positive), None);
        assert_eq!(read("0.5", false, &positive), Some(true));
        assert_eq!(read("0", false, &positive), Some(false));
    }
}
