//! Code point classes as llama.cpp sees them, and GPT-2's byte <-> printable-char mapping.

use super::unicode_data::{RANGES, WHITESPACE};

/// Category bits of one code point, laid out like llama.cpp's `unicode_cpt_flags`.
/// `Flags::NONE` stands for "past the end of the fragment", which no real code point has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const NONE: Flags = Flags(0);
    const NUMBER: u16 = 0x0002;
    const LETTER: u16 = 0x0004;
    const PUNCTUATION: u16 = 0x0020;
    const WHITESPACE: u16 = 0x0100;

    pub fn of(c: char) -> Flags {
        let cp = c as u32;
        // RANGES starts at 0 and ends with a sentinel at 0x110000, so the index is valid.
        let i = RANGES
            .partition_point(|&(start, _)| start <= cp)
            .saturating_sub(1);
        let mut bits = u16::from(RANGES[i].1);
        if WHITESPACE.contains(&cp) {
            bits |= Self::WHITESPACE;
        }
        Flags(bits)
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
}

/// GPT-2's byte-level alphabet: every byte maps to a printable code point so that BPE
/// vocabularies can be stored as text. Bytes that are already printable Latin-1 map to
/// themselves; the others are numbered from U+0100 upwards in byte order.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let cp = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every value is below 0x144, so always a valid scalar value.
        *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char_table`] for one char: `None` for chars outside the alphabet.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    match cp {
        0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF => Some(cp as u8),
        0x100..=0x143 => {
            // The 68 non-printable bytes, in order: 0x00-0x20, 0x7F-0xA0, 0xAD.
            let n = (cp - 0x100) as u8;
            Some(match n {
                0..=0x20 => n,
                0x21..=0x42 => n - 0x21 + 0x7F,
                _ => 0xAD,
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_round_trips_all_bytes() {
        let table = byte_to_char_table();
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = table[b as usize];
            assert!(seen.insert(c), "duplicate char for byte {b}");
            assert_eq!(char_to_byte(c), Some(b), "byte {b:#x} -> {c:?}");
        }
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        assert_eq!(char_to_byte('a'), Some(b'a'));
        assert_eq!(char_to_byte('€'), None);
    }

    #[test]
    fn flags_match_unicode_categories() {
        assert!(Flags::of('a').is_letter());
        assert!(Flags::of('é').is_letter());
        assert!(Flags::of('中').is_letter());
        assert!(Flags::of('7').is_number());
        assert!(Flags::of('٣').is_number()); // Arabic-Indic digit three
        assert!(Flags::of('Ⅻ').is_number()); // letter number
        assert!(Flags::of(' ').is_whitespace());
        assert!(Flags::of('\u{3000}').is_whitespace());
        assert!(Flags::of('\n').is_whitespace());
        assert!(Flags::of('!').is_punctuation());
        assert!(!Flags::of('$').is_punctuation()); // a symbol
        let emoji = Flags::of('😀');
        assert!(
            !emoji.is_letter() && !emoji.is_number() && !emoji.is_whitespace() && !emoji.is_none()
        );
        // Unassigned code points are "undefined", which is still not NONE.
        assert!(!Flags::of('\u{0378}').is_none());
    }
}
