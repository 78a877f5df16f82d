//! A bounds-checked little-endian reader over the header bytes of a GGUF file.
//!
//! Every read checks the bytes remaining first and reports the field it was reading
//! and its offset. Field names are built lazily (`what` closures) so the happy path
//! does not format a string per token.

use super::error::GgufError;

/// Longest string the reader accepts. Real files top out around a few hundred KiB (chat
/// templates); a bigger length is a crafted or corrupt file.
pub(crate) const MAX_STRING_LEN: u64 = 16 << 20;

pub(crate) struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    /// Takes `n` bytes, or fails without moving when fewer remain.
    pub(crate) fn take(
        &mut self,
        n: u64,
        what: impl FnOnce() -> String,
    ) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what: what(),
                offset: self.pos(),
            });
        }
        // n <= remaining <= usize::MAX, so the cast is exact.
        let start = self.pos;
        self.pos += n as usize;
        Ok(&self.buf[start..self.pos])
    }

    fn array<const N: usize>(
        &mut self,
        what: impl FnOnce() -> String,
    ) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: impl FnOnce() -> String) -> Result<u8, GgufError> {
        self.array::<1>(what).map(|b| b[0])
    }

    pub(crate) fn u16(&mut self, what: impl FnOnce() -> String) -> Result<u16, GgufError> {
        self.array(what).map(u16::from_le_bytes)
    }

    pub(crate) fn u32(&mut self, what: impl FnOnce() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self, what: impl FnOnce() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A GGUF string: u64 byte length, then UTF-8 bytes (no terminator).
    pub(crate) fn string(&mut self, what: impl Fn() -> String) -> Result<&'a str, GgufError> {
        let len_at = self.pos();
        let len = self.u64(|| format!("length of {}", what()))?;
        if len > MAX_STRING_LEN {
            return Err(GgufError::TooLarge {
                what: format!("length of {}", what()),
                value: len,
                limit: MAX_STRING_LEN,
                offset: len_at,
            });
        }
        let at = self.pos();
        let bytes = self.take(len, || format!("{} ({len} bytes)", what()))?;
        std::str::from_utf8(bytes).map_err(|_| GgufError::BadUtf8 {
            what: what(),
            offset: at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_tracks_offset() {
        let bytes = [1u8, 2, 0, 3, 0, 0, 0, 9];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u8(String::new).ok(), Some(1));
        assert_eq!(c.u16(String::new).ok(), Some(2));
        assert_eq!(c.u32(String::new).ok(), Some(3));
        assert_eq!(c.pos(), 7);
        assert_eq!(c.remaining(), 1);
        match c.u64(|| "field".into()) {
            Err(GgufError::Truncated { what, offset }) => {
                assert_eq!(what, "field");
                assert_eq!(offset, 7);
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        // A failed read does not move the cursor.
        assert_eq!(c.u8(String::new).ok(), Some(9));
    }

    #[test]
    fn strings_are_length_checked_and_utf8_checked() {
        let mut ok = 3u64.to_le_bytes().to_vec();
        ok.extend_from_slice(b"abc");
        assert_eq!(Cursor::new(&ok).string(|| "s".into()).ok(), Some("abc"));

        let mut bad = 2u64.to_le_bytes().to_vec();
        bad.extend_from_slice(&[0xff, 0xfe]);
        assert!(matches!(
            Cursor::new(&bad).string(|| "s".into()),
            Err(GgufError::BadUtf8 { offset: 8, .. })
        ));

        let huge = (MAX_STRING_LEN + 1).to_le_bytes();
        assert!(matches!(
            Cursor::new(&huge).string(|| "s".into()),
            Err(GgufError::TooLarge { offset: 0, .. })
        ));

        let short = 5u64.to_le_bytes();
        assert!(matches!(
            Cursor::new(&short).string(|| "s".into()),
            Err(GgufError::Truncated { offset: 8, .. })
        ));
    }
}
