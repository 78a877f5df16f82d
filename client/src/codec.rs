//! Framing shared by the client and the daemon: a big-endian `u32` length, then one
//! postcard-encoded message.
//!
//! The length is checked against the receiver's limit before any buffer is grown for the
//! payload, so a peer cannot make the other side allocate more than the limit. A frame
//! that is over the limit and a frame that does not decode are different errors, because
//! the daemon answers them differently (`FrameTooLarge` vs `BadFrame`).

use std::{io, marker::PhantomData};

use bytes::{Buf, BufMut, BytesMut};
use serde::{de::DeserializeOwned, Serialize};
use tokio_util::codec::{Decoder, Encoder, LengthDelimitedCodec};

/// Bytes in the length prefix.
pub const HEADER_BYTES: usize = 4;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The length prefix announces more than the receiver accepts. Nothing was allocated
    /// for it; the connection cannot be resynchronised and should be closed.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
    /// A complete frame whose payload is not a valid message (or has trailing bytes).
    #[error("frame does not decode as a message: {0}")]
    BadFrame(String),
    /// A message that postcard could not encode, or whose encoding exceeds `u32::MAX`.
    #[error("message cannot be encoded: {0}")]
    Encode(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Decodes `In` messages and encodes `Out` messages over length-prefixed frames.
///
/// The daemon uses `MessageCodec<ClientMessage, ServerMessage>` and the client the
/// reverse. The limit applies to frames received; frames sent are bounded only by the
/// `u32` prefix, since the receiver enforces its own limit.
pub struct MessageCodec<In, Out> {
    frames: LengthDelimitedCodec,
    max_frame_bytes: usize,
    // `fn` pointer: the codec neither owns nor shares values of these types.
    _types: PhantomData<fn(Out) -> In>,
}

impl<In, Out> MessageCodec<In, Out> {
    pub fn new(max_frame_bytes: usize) -> Self {
        let frames = LengthDelimitedCodec::builder()
            .big_endian()
            .length_field_length(HEADER_BYTES)
            .max_frame_length(max_frame_bytes)
            .new_codec();
        Self {
            frames,
            max_frame_bytes,
            _types: PhantomData,
        }
    }

    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }
}

impl<In, Out> std::fmt::Debug for MessageCodec<In, Out> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageCodec")
            .field("max_frame_bytes", &self.max_frame_bytes)
            .finish()
    }
}

impl<In: DeserializeOwned, Out> Decoder for MessageCodec<In, Out> {
    type Item = In;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<In>, CodecError> {
        // Read the announced length ourselves first: `LengthDelimitedCodec` enforces the
        // same limit, but its error does not say how large the frame was.
        if src.len() >= HEADER_BYTES {
            let len = (&src[..HEADER_BYTES]).get_u32() as usize;
            if len > self.max_frame_bytes {
                return Err(CodecError::FrameTooLarge {
                    len,
                    max: self.max_frame_bytes,
                });
            }
        }
        match self.frames.decode(src)? {
            None => Ok(None),
            Some(frame) => decode_payload(&frame).map(Some),
        }
    }
}

impl<In, Out: Serialize> Encoder<Out> for MessageCodec<In, Out> {
    type Error = CodecError;

    fn encode(&mut self, item: Out, dst: &mut BytesMut) -> Result<(), CodecError> {
        encode_frame(&item, dst)
    }
}

/// Decodes one frame's payload, refusing trailing bytes: a payload longer than its
/// message means the peers disagree about the message's shape.
pub fn decode_payload<T: DeserializeOwned>(payload: &[u8]) -> Result<T, CodecError> {
    let (message, rest) =
        postcard::take_from_bytes(payload).map_err(|e| CodecError::BadFrame(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CodecError::BadFrame(format!(
            "{} trailing bytes after the message",
            rest.len()
        )));
    }
    Ok(message)
}

/// Appends one complete frame (prefix and payload) for `message` to `dst`.
pub fn encode_frame<T: Serialize + ?Sized>(
    message: &T,
    dst: &mut BytesMut,
) -> Result<(), CodecError> {
    let payload = postcard::to_allocvec(message).map_err(|e| CodecError::Encode(e.to_string()))?;
    let len = u32::try_from(payload.len())
        .map_err(|_| CodecError::Encode(format!("{} bytes do not fit a frame", payload.len())))?;
    dst.reserve(HEADER_BYTES + payload.len());
    dst.put_u32(len);
    dst.extend_from_slice(&payload);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{ClientMessage, Hello, ServerMessage};

    type ServerSide = MessageCodec<ClientMessage, ServerMessage>;

    fn hello() -> ClientMessage {
        ClientMessage::Hello(Hello {
            major: 1,
            minor: 0,
            client: "test".into(),
        })
    }

    fn frame_of(message: &ClientMessage) -> BytesMut {
        let mut buf = BytesMut::new();
        encode_frame(message, &mut buf).unwrap();
        buf
    }

    #[test]
    fn round_trips_a_message_through_encoder_and_decoder() {
        let mut client = MessageCodec::<ServerMessage, ClientMessage>::new(1024);
        let mut server = ServerSide::new(1024);
        let mut buf = BytesMut::new();
        client.encode(hello(), &mut buf).unwrap();
        client
            .encode(ClientMessage::Cancel { id: 7 }, &mut buf)
            .unwrap();
        assert_eq!(server.decode(&mut buf).unwrap(), Some(hello()));
        assert_eq!(
            server.decode(&mut buf).unwrap(),
            Some(ClientMessage::Cancel { id: 7 })
        );
        assert_eq!(server.decode(&mut buf).unwrap(), None);
        assert!(buf.is_empty());
    }

    #[test]
    fn header_is_big_endian_payload_length() {
        let buf = frame_of(&hello());
        let payload = postcard::to_allocvec(&hello()).unwrap();
        assert_eq!(&buf[..4], &(payload.len() as u32).to_be_bytes());
        assert_eq!(&buf[4..], &payload[..]);
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let full = frame_of(&hello());
        let mut codec = ServerSide::new(1024);
        // Every strict prefix, including a partial header, is "not yet".
        for cut in 0..full.len() {
            let mut buf = BytesMut::from(&full[..cut]);
            assert_eq!(
                codec.decode(&mut buf).unwrap(),
                None,
                "prefix of {cut} bytes"
            );
        }
        let mut buf = BytesMut::from(&full[..3]);
        assert_eq!(codec.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&full[3..]);
        assert_eq!(codec.decode(&mut buf).unwrap(), Some(hello()));
    }

    #[test]
    fn oversized_frame_is_refused_from_its_header_alone() {
        let mut codec = ServerSide::new(16);
        let mut buf = BytesMut::new();
        buf.put_u32(17);
        match codec.decode(&mut buf) {
            Err(CodecError::FrameTooLarge { len: 17, max: 16 }) => {}
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        // The decoder did not reserve room for the announced payload.
        assert!(buf.capacity() < 1 << 10);
    }

    #[test]
    fn frame_at_the_limit_is_accepted() {
        let frame = frame_of(&hello());
        let mut codec = ServerSide::new(frame.len() - HEADER_BYTES);
        let mut buf = frame.clone();
        assert_eq!(codec.decode(&mut buf).unwrap(), Some(hello()));
        let mut codec = ServerSide::new(frame.len() - HEADER_BYTES - 1);
        let mut buf = frame;
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::FrameTooLarge { .. })
        ));
    }

    #[test]
    fn garbage_payload_is_a_bad_frame() {
        let mut codec = ServerSide::new(1024);
        let mut buf = BytesMut::new();
        buf.put_u32(3);
        buf.extend_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::BadFrame(_))
        ));
    }

    #[test]
    fn trailing_bytes_make_a_bad_frame() {
        let mut payload = postcard::to_allocvec(&hello()).unwrap();
        payload.push(0);
        let mut buf = BytesMut::new();
        buf.put_u32(payload.len() as u32);
        buf.extend_from_slice(&payload);
        let mut codec = ServerSide::new(1024);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::BadFrame(_))
        ));
    }

    #[test]
    fn empty_payload_is_a_bad_frame() {
        let mut buf = BytesMut::new();
        buf.put_u32(0);
        let mut codec = ServerSide::new(1024);
        assert!(matches!(
            codec.decode(&mut buf),
            Err(CodecError::BadFrame(_))
        ));
    }

    #[test]
    fn encoder_is_not_bound_by_the_decode_limit() {
        // The limit protects the receiver; a large reply is the client's to accept.
        let mut codec = MessageCodec::<ClientMessage, ClientMessage>::new(8);
        let big = ClientMessage::Tokenize {
            id: 1,
            text: "x".repeat(100),
            special: false,
        };
        let mut buf = BytesMut::new();
        codec.encode(big.clone(), &mut buf).unwrap();
        let mut reader = MessageCodec::<ClientMessage, ClientMessage>::new(1024);
        assert_eq!(reader.decode(&mut buf).unwrap(), Some(big));
    }
}
