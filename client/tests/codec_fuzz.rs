//! Bounded fuzzing of the frame decoder, in both directions, for every protocol
//! message: valid frames round-trip however they are split; arbitrary bytes and mutated
//! frames decode or fail with `BadFrame`/`FrameTooLarge`, never panic, and never take
//! more heap than the bound below. Runs with the normal test suite (a few seconds).

#[path = "support/alloc_counter.rs"]
mod alloc_counter;
#[path = "support/arb.rs"]
mod arb;

use bytes::{BufMut, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::Index;
use serde::de::DeserializeOwned;
use serde::Serialize;
use spark_client::codec::{encode_frame, CodecError, MessageCodec, HEADER_BYTES};
use spark_client::protocol::*;
use tokio_util::codec::Decoder;

use alloc_counter::{heap_during, HeapUse};

/// Heap per payload byte of the worst decodable shape: a sequence of empty strings is
/// one byte each on the wire and 24 bytes in memory, vectors grow to twice their length,
/// and a reallocation briefly holds old and new buffers.
const DECODED_PER_BYTE: u64 = 24 * 3;

/// What serde may preallocate per payload byte while decoding messages of type `T`.
/// postcard gives a sequence's length as a size hint whenever the bytes left could hold
/// that many elements at one byte each (a length they cannot back costs nothing), and
/// serde reserves that many elements, however large each is in memory: a claim is
/// bounded by the payload, not by what the elements need on the wire. Sequences nested
/// in a sequence's element can claim the same bytes again before the decode fails, so
/// the deepest chain counts whole.
trait Preallocation {
    fn per_byte() -> u64;
}

fn size<T>() -> u64 {
    std::mem::size_of::<T>() as u64
}

impl Preallocation for ClientMessage {
    /// `ChatWithTools`: messages, then one message's `tool_calls`; the other sequences
    /// (`tools`, chat messages, `stop`, `logit_bias`) hold elements no larger and nest
    /// no deeper.
    fn per_byte() -> u64 {
        let chain = size::<ToolChatMessage>() + size::<ToolCall>();
        [
            chain,
            size::<ToolSpec>(),
            size::<ChatMessage>(),
            size::<String>(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

impl Preallocation for ServerMessage {
    /// The jobs list's records are the largest elements; none holds a sequence.
    fn per_byte() -> u64 {
        [
            size::<JobRecord>(),
            size::<ModelInfo>(),
            size::<TokenPiece>(),
            size::<(u32, String, f32)>(),
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }
}

/// The most heap decoding may take after `fed` bytes arrived, for frames of `limit`:
/// the read buffer (at most one frame beyond what arrived, grown by doubling), the
/// decoded message, and what serde reserved for sequences on the way.
fn heap_bound<T: Preallocation>(fed: usize, limit: usize) -> u64 {
    let buffer = 2 * (fed + limit + HEADER_BYTES) as u64;
    let payload = fed.min(limit) as u64;
    buffer + (DECODED_PER_BYTE + T::per_byte()) * payload + (16 << 10)
}

/// What one decode call may legitimately return.
fn acceptable<T>(result: &Result<Option<T>, CodecError>) -> bool {
    matches!(
        result,
        Ok(_) | Err(CodecError::BadFrame(_) | CodecError::FrameTooLarge { .. })
    )
}

/// Feeds `bytes` in `chunk`-sized pieces, decoding after each as a framed reader does,
/// until the input is used up or an error ends the connection. Returns the messages.
fn decode_stream<T: DeserializeOwned + Serialize + Preallocation>(
    bytes: &[u8],
    chunk: usize,
    limit: usize,
) -> (Vec<T>, Option<CodecError>, HeapUse) {
    let mut codec = MessageCodec::<T, T>::new(limit);
    let ((messages, error), heap) = heap_during(|| {
        let mut buf = BytesMut::new();
        let mut messages = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            buf.extend_from_slice(piece);
            loop {
                let result = codec.decode(&mut buf);
                assert!(acceptable(&result), "unexpected decode result");
                match result {
                    Ok(Some(m)) => messages.push(m),
                    Ok(None) => break,
                    Err(e) => return (messages, Some(e)),
                }
            }
            // Bounded by the limit whatever the header announced.
            assert!(
                buf.capacity() <= 2 * (limit + HEADER_BYTES + piece.len()) + 64,
                "buffer of {} bytes for frames of at most {limit}",
                buf.capacity()
            );
        }
        (messages, None)
    });
    assert!(
        heap.peak <= heap_bound::<T>(bytes.len(), limit),
        "{} heap bytes decoding {} bytes (limit {limit})",
        heap.peak,
        bytes.len()
    );
    (messages, error, heap)
}

fn frame<T: Serialize>(message: &T) -> BytesMut {
    let mut buf = BytesMut::new();
    encode_frame(message, &mut buf).expect("encode");
    buf
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: Index, mask: u8 },
    Set { at: Index, byte: u8 },
    Truncate { at: Index },
    Append { bytes: Vec<u8> },
    Length { len: u32 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 1u8..).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        3 => (any::<Index>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Set { at, byte }),
        1 => any::<Index>().prop_map(|at| Mutation::Truncate { at }),
        1 => vec(any::<u8>(), 1..16).prop_map(|bytes| Mutation::Append { bytes }),
        1 => any::<u32>().prop_map(|len| Mutation::Length { len }),
    ]
}

fn mutate(frame: &mut Vec<u8>, m: &Mutation) {
    match m {
        Mutation::Flip { at, mask } if !frame.is_empty() => {
            let i = at.index(frame.len());
            frame[i] ^= mask;
        }
        Mutation::Set { at, byte } if !frame.is_empty() => {
            let i = at.index(frame.len());
            frame[i] = *byte;
        }
        Mutation::Truncate { at } => {
            let keep = at.index(frame.len() + 1);
            frame.truncate(keep);
        }
        Mutation::Append { bytes } => frame.extend_from_slice(bytes),
        Mutation::Length { len } if frame.len() >= HEADER_BYTES => {
            frame[..HEADER_BYTES].copy_from_slice(&len.to_be_bytes());
        }
        _ => {}
    }
}

/// Decodes a mutated frame: whatever it decodes to must be a message that encodes again.
fn check_mutated<T: DeserializeOwned + Serialize + Preallocation>(bytes: &[u8], chunk: usize) {
    let (messages, _error, _) = decode_stream::<T>(bytes, chunk, DEFAULT_MAX_FRAME_BYTES);
    for m in &messages {
        let mut buf = BytesMut::new();
        encode_frame(m, &mut buf).expect("a decoded message encodes");
    }
}

/// A jobs list that claims as many records as it has bytes: serde reserves them all
/// (the allowance above is not slack) and the peak stays within it.
#[test]
fn a_claimed_length_the_bytes_can_back_is_reserved_within_the_bound() {
    let empty = frame(&ServerMessage::Jobs {
        id: 0,
        jobs: Vec::new(),
    });
    let mut payload = empty[HEADER_BYTES..].to_vec();
    assert_eq!(payload.pop(), Some(0), "the empty list's length");
    // 400 as a varint: more records than the old flat allowance covered.
    let claimed = 400u64;
    payload.extend([0x80 | (claimed & 0x7F) as u8, (claimed >> 7) as u8]);
    payload.extend(std::iter::repeat_n(0xFF, claimed as usize));
    let mut bytes = (payload.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(&payload);
    let (_, _, heap) = decode_stream::<ServerMessage>(&bytes, bytes.len(), 1024);
    let reserved = claimed * size::<JobRecord>();
    assert!(
        heap.peak >= reserved,
        "{} heap bytes: the {claimed} records claimed were not reserved",
        heap.peak
    );
}

proptest! {
    // No persistence file: integration tests have no `lib.rs` beside them to put it in.
    #![proptest_config(ProptestConfig {
        cases: 2048,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn client_messages_round_trip_however_split(m in arb::client_message(), cut in any::<Index>()) {
        let bytes = frame(&m);
        let cut = cut.index(bytes.len() + 1);
        let mut codec = MessageCodec::<ClientMessage, ServerMessage>::new(bytes.len());
        let mut buf = BytesMut::from(&bytes[..cut]);
        if cut < bytes.len() {
            prop_assert!(codec.decode(&mut buf).unwrap().is_none());
            buf.extend_from_slice(&bytes[cut..]);
        }
        prop_assert_eq!(codec.decode(&mut buf).unwrap(), Some(m));
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn server_messages_round_trip_however_split(m in arb::server_message(), cut in any::<Index>()) {
        let bytes = frame(&m);
        let cut = cut.index(bytes.len() + 1);
        let mut codec = MessageCodec::<ServerMessage, ClientMessage>::new(bytes.len());
        let mut buf = BytesMut::from(&bytes[..cut]);
        if cut < bytes.len() {
            prop_assert!(codec.decode(&mut buf).unwrap().is_none());
            buf.extend_from_slice(&bytes[cut..]);
        }
        prop_assert_eq!(codec.decode(&mut buf).unwrap(), Some(m));
    }

    #[test]
    fn arbitrary_bytes_decode_or_fail_cleanly(
        bytes in vec(any::<u8>(), 0..2048),
        chunk in 1usize..600,
        limit in prop_oneof![Just(16usize), Just(300), Just(DEFAULT_MAX_FRAME_BYTES)],
    ) {
        decode_stream::<ClientMessage>(&bytes, chunk, limit);
        decode_stream::<ServerMessage>(&bytes, chunk, limit);
    }

    /// Arbitrary payloads behind a correct header: the postcard decoder itself, without
    /// the header check in front of it.
    #[test]
    fn arbitrary_payloads_decode_or_fail_cleanly(payload in vec(any::<u8>(), 0..512)) {
        let mut bytes = (payload.len() as u32).to_be_bytes().to_vec();
        bytes.extend_from_slice(&payload);
        let (c, ce, _) = decode_stream::<ClientMessage>(&bytes, bytes.len(), 1024);
        prop_assert!(c.len() + usize::from(ce.is_some()) == 1);
        let (s, se, _) = decode_stream::<ServerMessage>(&bytes, bytes.len(), 1024);
        prop_assert!(s.len() + usize::from(se.is_some()) == 1);
    }

    #[test]
    fn mutated_client_frames_decode_or_fail_cleanly(
        m in arb::client_message(),
        mutations in vec(mutation(), 1..4),
        chunk in 1usize..64,
    ) {
        let mut bytes = frame(&m).to_vec();
        for mu in &mutations {
            mutate(&mut bytes, mu);
        }
        check_mutated::<ClientMessage>(&bytes, chunk);
    }

    #[test]
    fn mutated_server_frames_decode_or_fail_cleanly(
        m in arb::server_message(),
        mutations in vec(mutation(), 1..4),
        chunk in 1usize..64,
    ) {
        let mut bytes = frame(&m).to_vec();
        for mu in &mutations {
            mutate(&mut bytes, mu);
        }
        check_mutated::<ServerMessage>(&bytes, chunk);
    }
}

/// The worst shapes a frame within the limit can take, measured. Lists past their caps
/// (`spark_client::limits`) are refused from their announced length, so a frame of a
/// million empty strings costs about its own bytes; at the caps, decoding costs the
/// payload plus the capped lists.
#[test]
fn the_heap_a_frame_costs_is_bounded_by_its_size_and_the_list_caps() {
    use spark_client::limits::{MAX_CHAT_MESSAGES, MAX_LOGIT_BIAS, MAX_STOP_STRINGS};
    let limit = DEFAULT_MAX_FRAME_BYTES;
    let base = GenerateRequest {
        id: 1,
        model: None,
        input: PromptInput::Raw {
            text: String::new(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: None,
        stop: Vec::new(),
        logprobs: None,
    };
    let n = limit - 64;
    let chat = |messages: usize| PromptInput::Chat {
        messages: vec![ChatMessage::new("", ""); messages],
    };
    let refused = [
        (
            "empty stop strings",
            GenerateRequest {
                stop: vec![String::new(); n],
                ..base.clone()
            },
        ),
        (
            "empty chat messages",
            GenerateRequest {
                input: chat(n / 2),
                ..base.clone()
            },
        ),
    ];
    for (what, request) in refused {
        let bytes = frame(&ClientMessage::Generate(request));
        assert!(bytes.len() - HEADER_BYTES <= limit);
        let (messages, error, heap) = decode_stream::<ClientMessage>(&bytes, bytes.len(), limit);
        assert!(messages.is_empty() && matches!(error, Some(CodecError::BadFrame(_))));
        println!(
            "{what}: a {}-byte frame is refused with {} heap bytes in use at most ({:.1}x)",
            bytes.len(),
            heap.peak,
            heap.peak as f64 / bytes.len() as f64,
        );
        assert!(heap.peak <= 2 * bytes.len() as u64 + (64 << 10), "{what}");
    }

    let at_caps = GenerateRequest {
        input: chat(MAX_CHAT_MESSAGES),
        stop: vec![String::new(); MAX_STOP_STRINGS],
        sampling: SamplingParams {
            logit_bias: vec![(0, 0.0); MAX_LOGIT_BIAS],
            ..SamplingParams::default()
        },
        ..base.clone()
    };
    let bytes = frame(&ClientMessage::Generate(at_caps));
    let (messages, error, heap) = decode_stream::<ClientMessage>(&bytes, bytes.len(), limit);
    assert!(error.is_none() && messages.len() == 1);
    let lists = (MAX_CHAT_MESSAGES * std::mem::size_of::<ChatMessage>()
        + MAX_LOGIT_BIAS * std::mem::size_of::<(u32, f32)>()
        + MAX_STOP_STRINGS * std::mem::size_of::<String>()) as u64;
    println!(
        "every list at its cap: a {}-byte frame takes {} heap bytes to decode (lists {lists})",
        bytes.len(),
        heap.peak,
    );
    assert!(heap.peak <= 3 * bytes.len() as u64 + lists + (64 << 10));
}

/// A frame that announces a sequence far longer than its remaining bytes fails without
/// allocating for the announced length.
#[test]
fn a_tiny_frame_announcing_a_huge_sequence_fails_without_allocating_for_it() {
    let request = GenerateRequest {
        id: 1,
        model: None,
        input: PromptInput::Raw {
            text: String::new(),
            special: false,
        },
        sampling: SamplingParams::default(),
        max_tokens: None,
        stop: Vec::new(),
        logprobs: None,
    };
    let mut payload = postcard::to_allocvec(&ClientMessage::Generate(request)).unwrap();
    // The payload ends with `stop`'s length (0) and `logprobs` (None): announce 2^32 - 1
    // stop strings instead, and give none.
    assert_eq!(payload[payload.len() - 2..], [0, 0]);
    payload.truncate(payload.len() - 2);
    payload.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    let mut bytes = BytesMut::new();
    bytes.put_u32(payload.len() as u32);
    bytes.extend_from_slice(&payload);
    let limit = 64;
    let (messages, error, heap) = decode_stream::<ClientMessage>(&bytes, bytes.len(), limit);
    assert!(messages.is_empty());
    assert!(matches!(error, Some(CodecError::BadFrame(_))), "{error:?}");
    println!(
        "a {}-byte frame (limit {limit}) announcing 2^32 stop strings: largest allocation {} bytes, peak {}",
        bytes.len(),
        heap.largest,
        heap.peak
    );
    assert!(heap.largest <= bytes.len() as u64 * 4, "{heap:?}");
}
