//! The string `format`s sparkd enforces: those OpenAI's structured outputs support, as
//! regular expressions for [`Pattern`](super::pattern::Pattern).
//!
//! Each expression matches only valid values (calendar dates with leap years, hours
//! below 24…), though not every valid spelling: no leap seconds, no IPv4-in-IPv6, no
//! quoted e-mail local parts, hostname labels of at most 32 letters and digits. A model
//! writes the common forms, and a narrower language keeps the automata small. Other
//! formats (`uri`, `regex`…) stay annotations, as JSON Schema has them by default.

/// `[0-9]{4}-MM-DD`, February 29th only in leap years.
const DATE: &str = concat!(
    "(?:[0-9]{4}-(?:",
    "(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])",
    "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)",
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))",
    // Leap years: divisible by 4, and by 400 where they end a century.
    "|(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29)",
);

/// RFC 3339 `full-time`: an offset is part of it. Up to nine fraction digits (a small
/// model can otherwise repeat one until `max_tokens`).
const TIME: &str = concat!(
    "(?:(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?",
    "(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9]))",
);

/// RFC 3339 Appendix A's `dur-time`: hours, minutes and seconds, largest first, each
/// part only after the one above it. A macro, so `concat!` can take it twice below.
macro_rules! duration_time {
    () => {
        "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
    };
}

/// RFC 3339 Appendix A: a week count alone, or date parts largest first, then a time
/// part (`dur-year = Y [dur-month]`, `dur-month = M [dur-day]`, and so on).
const DURATION: &str = concat!(
    "(?:P(?:[0-9]+W",
    "|(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)",
    "(?:",
    duration_time!(),
    ")?",
    "|",
    duration_time!(),
    "))",
);

const UUID: &str =
    "(?:[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})";

const IPV4: &str = concat!(
    "(?:(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}",
    "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])",
);

/// Eight groups, or fewer around one `::`.
const IPV6: &str = concat!(
    "(?:(?:[0-9a-fA-F]{1,4}:){7}[0-9a-fA-F]{1,4}",
    "|(?:[0-9a-fA-F]{1,4}:){1,7}:",
    "|(?:[0-9a-fA-F]{1,4}:){1,6}:[0-9a-fA-F]{1,4}",
    "|(?:[0-9a-fA-F]{1,4}:){1,5}(?::[0-9a-fA-F]{1,4}){1,2}",
    "|(?:[0-9a-fA-F]{1,4}:){1,4}(?::[0-9a-fA-F]{1,4}){1,3}",
    "|(?:[0-9a-fA-F]{1,4}:){1,3}(?::[0-9a-fA-F]{1,4}){1,4}",
    "|(?:[0-9a-fA-F]{1,4}:){1,2}(?::[0-9a-fA-F]{1,4}){1,5}",
    "|[0-9a-fA-F]{1,4}:(?::[0-9a-fA-F]{1,4}){1,6}",
    "|:(?:(?::[0-9a-fA-F]{1,4}){1,7}|:))",
);

/// A hostname label: letters and digits, single hyphens between them (two in a row
/// would make the third and fourth characters `--`, which IDNA reserves).
const LABEL: &str = "[A-Za-z0-9](?:-?[A-Za-z0-9]){0,31}";

/// Regular expression (the `regex` crate's syntax, unanchored: the caller anchors it)
/// and most characters, for a `format` sparkd enforces; `None` for one it leaves as an
/// annotation.
pub fn format_regex(format: &str) -> Option<(String, u32)> {
    let hostname = format!("(?:{LABEL}(?:\\.{LABEL})*)");
    // A dot-atom local part of at most 64 characters, and a domain with a dot in it.
    let email =
        format!("(?:[A-Za-z0-9_%+-](?:\\.?[A-Za-z0-9_%+-]){{0,31}}@{LABEL}(?:\\.{LABEL})+)");
    let (regex, most) = match format {
        "date" => (DATE.to_string(), u32::MAX),
        "time" => (TIME.to_string(), u32::MAX),
        "date-time" => (format!("(?:{DATE}T{TIME})"), u32::MAX),
        "duration" => (DURATION.to_string(), u32::MAX),
        "uuid" => (UUID.to_string(), u32::MAX),
        "ipv4" => (IPV4.to_string(), u32::MAX),
        "ipv6" => (IPV6.to_string(), u32::MAX),
        "hostname" => (hostname, 253),
        "email" => (email, 254),
        _ => return None,
    };
    Some((format!("^{regex}$"), most))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::schema::pattern::Pattern;
    use serde_json::json;

    /// The formats [`format_regex`] knows, for documentation and tests.
    const ENFORCED_FORMATS: &[&str] = &[
        "date",
        "time",
        "date-time",
        "duration",
        "uuid",
        "ipv4",
        "ipv6",
        "hostname",
        "email",
    ];

    fn validator(format: &str) -> jsonschema::Validator {
        jsonschema::options()
            .should_validate_formats(true)
            .build(&json!({"type": "string", "format": format}))
            .unwrap()
    }

    fn pattern(format: &str) -> Pattern {
        let (regex, _) = format_regex(format).unwrap();
        Pattern::regex(format, &regex).unwrap()
    }

    /// Every format's expression compiles, and each example is matched exactly when
    /// jsonschema's own format check passes it (or, for the spellings sparkd leaves
    /// out, is refused though valid).
    #[test]
    fn each_format_matches_what_a_validator_accepts() {
        // (format, both accept, both refuse, valid but not generated)
        type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (
                "date",
                &[
                    "2026-12-05",
                    "2024-02-29",
                    "2000-02-29",
                    "1999-12-31",
                    "2026-04-30",
                ],
                &[
                    "2026-02-29",
                    "1900-02-29",
                    "2026-04-31",
                    "2026-13-01",
                    "2026-1-05",
                    "26-12-05",
                ],
                &[],
            ),
            (
                "time",
                &["23:59:59Z", "00:00:00.123+05:30", "12:30:00-08:00"],
                &["24:00:00Z", "12:60:00Z", "12:30:00", "12:30Z"],
                &["23:59:60Z", "12:30:00z"],
            ),
            (
                "date-time",
                &["2026-12-05T22:50:20Z", "2024-02-29T00:00:00.5+01:00"],
                &[
                    "2026-12-05 22:50:20Z",
                    "2026-12-05T22:50:20",
                    "2026-02-30T00:00:00Z",
                ],
                &["2026-12-05t22:50:20Z"],
            ),
            (
                "duration",
                &[
                    "P1W",
                    "P3D",
                    "P1Y2M3DT4H5M6S",
                    "PT1H",
                    "PT5M30S",
                    "P1M",
                    "PT0S",
                ],
                &["P", "PT", "P1D2Y", "P1WT1H", "P1Y3D", "1D"],
                &[],
            ),
            (
                "uuid",
                &[
                    "123e4567-e89b-12d3-a456-426614174000",
                    "123E4567-E89B-12D3-A456-426614174000",
                ],
                &[
                    "123e4567e89b12d3a456426614174000",
                    "123e4567-e89b-12d3-a456-42661417400g",
                ],
                &[],
            ),
            (
                "ipv4",
                &["192.168.0.1", "0.0.0.0", "255.255.255.255"],
                &["256.1.1.1", "1.2.3", "01.2.3.4", "1.2.3.4.5"],
                &[],
            ),
            (
                "ipv6",
                &[
                    "::1",
                    "::",
                    "2001:db8::8a2e:370:7334",
                    "fe80::",
                    "1:2:3:4:5:6:7:8",
                ],
                &["1:2:3:4:5:6:7:8:9", "12345::", "1::2::3", ":1"],
                &["::ffff:192.168.0.1"],
            ),
            (
                "hostname",
                &["example.com", "a", "my-host.local", "x1.y2.z3"],
                &[
                    "-a.com",
                    "a-.com",
                    "a..b",
                    "a.com.",
                    "a_b.com",
                    "ab--cd.com",
                ],
                &["xn--bcher-kva.example"],
            ),
            (
                "email",
                &[
                    "joe@example.com",
                    "first.last+tag@mail.example.org",
                    "a_b@x-y.io",
                ],
                &[
                    "joe",
                    "@example.com",
                    "joe@",
                    "jo..e@example.com",
                    ".joe@example.com",
                ],
                &["joe@localhost", "\"joe smith\"@example.com"],
            ),
        ];
        for &(format, both, neither, left_out) in cases {
            let v = validator(format);
            let p = pattern(format);
            let ours = |s: &str| {
                let text = serde_json::to_string(s).unwrap();
                p.walk_text(&text[1..text.len() - 1], 0, u32::MAX) == (true, true)
            };
            for s in both {
                assert!(v.is_valid(&json!(s)), "{format}: jsonschema refuses {s}");
                assert!(ours(s), "{format}: sparkd refuses {s}");
            }
            for s in neither {
                assert!(!v.is_valid(&json!(s)), "{format}: jsonschema accepts {s}");
                assert!(!ours(s), "{format}: sparkd accepts {s}");
            }
            for s in left_out {
                assert!(v.is_valid(&json!(s)), "{format}: jsonschema refuses {s}");
                assert!(!ours(s), "{format}: sparkd now generates {s}: move it");
            }
        }
        for format in ENFORCED_FORMATS {
            assert!(format_regex(format).is_some(), "{format}");
        }
        assert!(format_regex("uri").is_none());
    }
}
