//! A fixed-size rolling copy of the last bytes of a response body: where the engine's
//! own report (usage, Ollama's counters) sits, without ever holding the whole body.

/// Bytes kept: the last event of an SSE stream (the usage chunk) or the final NDJSON
/// line of an Ollama reply fits with room to spare.
pub const TAIL_BYTES: usize = 4096;

/// The last [`TAIL_BYTES`] bytes written, as a ring.
pub struct Tail {
    buf: Box<[u8; TAIL_BYTES]>,
    /// Where the next byte goes.
    pos: usize,
    /// True once the ring has wrapped: every slot holds a byte.
    full: bool,
}

impl Default for Tail {
    fn default() -> Self {
        Self::new()
    }
}

impl Tail {
    pub fn new() -> Self {
        Self {
            buf: Box::new([0; TAIL_BYTES]),
            pos: 0,
            full: false,
        }
    }

    /// Appends `bytes`, forgetting what falls out of the window. At most two copies.
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= TAIL_BYTES {
            self.buf.copy_from_slice(&bytes[bytes.len() - TAIL_BYTES..]);
            self.pos = 0;
            self.full = true;
            return;
        }
        let room = TAIL_BYTES - self.pos;
        if bytes.len() < room {
            self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
            self.pos += bytes.len();
        } else {
            let (first, rest) = bytes.split_at(room);
            self.buf[self.pos..].copy_from_slice(first);
            self.buf[..rest.len()].copy_from_slice(rest);
            self.pos = rest.len();
            self.full = true;
        }
    }

    /// The kept bytes, oldest first, into `out` (cleared first).
    pub fn copy_to(&self, out: &mut Vec<u8>) {
        out.clear();
        if self.full {
            out.extend_from_slice(&self.buf[self.pos..]);
        }
        out.extend_from_slice(&self.buf[..self.pos]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(tail: &Tail) -> Vec<u8> {
        let mut out = Vec::new();
        tail.copy_to(&mut out);
        out
    }

    fn stream(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 % 251) as u8).collect()
    }

    #[test]
    fn keeps_exactly_the_last_bytes_whatever_the_chunking() {
        let data = stream(3 * TAIL_BYTES + 123);
        for chunk in [1, 7, 100, TAIL_BYTES - 1, TAIL_BYTES, TAIL_BYTES + 5] {
            let mut tail = Tail::new();
            let mut written = 0;
            for piece in data.chunks(chunk) {
                tail.push(piece);
                written += piece.len();
                let want = &data[written.saturating_sub(TAIL_BYTES)..written];
                assert_eq!(kept(&tail), want, "chunk {chunk}, after {written} bytes");
            }
        }
    }
}
