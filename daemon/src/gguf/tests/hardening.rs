//! Crafted and damaged files: each must give the specific error naming what is wrong,
//! never a panic or a large allocation.

use super::alloc_counter::peak_heap_during;
use super::{one_tensor, sample_bytes, Raw};
use crate::gguf::{GgufError, GgufFile, Value};

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes(bytes)
}

fn expect_err(bytes: Vec<u8>) -> GgufError {
    match parse(bytes) {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => e,
    }
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let full = sample_bytes();
    let f = parse(full.clone()).expect("sample parses");
    let data_end = f
        .tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .expect("sample has tensors") as usize;
    for len in 0..data_end {
        match parse(full[..len].to_vec()) {
            Err(GgufError::Truncated { offset, .. }) => {
                assert!(offset <= len as u64, "len {len}: offset {offset}")
            }
            // Header complete, data section short.
            Err(GgufError::BadTensor { .. }) => assert!(len as u64 >= f.data_offset() - 31),
            other => panic!("prefix of {len} bytes: {other:?}"),
        }
    }
    // Trailing padding after the last tensor is optional.
    assert!(parse(full[..data_end].to_vec()).is_ok());
}

#[test]
fn bad_magic() {
    assert!(matches!(
        expect_err(b"GGML\x03\0\0\0".to_vec()),
        GgufError::BadMagic
    ));
    assert!(matches!(
        expect_err(b"GG".to_vec()),
        GgufError::Truncated { .. }
    ));
    assert!(matches!(
        expect_err(Vec::new()),
        GgufError::Truncated { .. }
    ));
}

#[test]
fn versions() {
    let v1 = expect_err(Raw::header(1, 0, 0).0);
    assert!(matches!(v1, GgufError::UnsupportedVersion(1)));
    assert!(v1.to_string().contains("version 1 is obsolete"), "{v1}");
    assert!(matches!(
        expect_err(Raw::header(4, 0, 0).0),
        GgufError::UnsupportedVersion(4)
    ));
    // A big-endian v3 file stores the version as 00 00 00 03.
    let be = b"GGUF"
        .iter()
        .copied()
        .chain([0, 0, 0, 3])
        .chain([0; 16])
        .collect();
    assert!(matches!(expect_err(be), GgufError::BigEndian(3)));
    let v2 = parse(Raw::header(2, 0, 1).kv_u32("k", 7).0).expect("v2 parses");
    assert_eq!(v2.version(), 2);
    assert_eq!(v2.metadata().get_u32("k").ok(), Some(7));
}

#[test]
fn huge_counts_fail_fast_without_allocating() {
    let crafted = [
        Raw::header(3, u64::MAX, 0).0,
        Raw::header(3, 0, u64::MAX).0,
        Raw::header(3, 1 << 40, 1 << 40).zeros(1000).0,
        // Array of u64::MAX u8s, of 1 << 61 strings, of arrays.
        Raw::header(3, 0, 1).str("k").u32(9).u32(0).u64(u64::MAX).0,
        Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(8)
            .u64(1 << 61)
            .zeros(64)
            .0,
        Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(9)
            .u64(u64::MAX / 2)
            .0,
        // Eleven u32s need 44 bytes; 40 remain.
        Raw::header(3, 0, 1)
            .str("k")
            .u32(9)
            .u32(4)
            .u64(11)
            .zeros(40)
            .0,
    ];
    for bytes in crafted {
        let len = bytes.len() as u64;
        let (r, peak) = peak_heap_during(|| parse(bytes));
        assert!(matches!(r, Err(GgufError::Truncated { .. })), "{r:?}");
        assert!(
            peak < 4096 + 64 * len,
            "peak heap {peak} for {len} input bytes"
        );
    }
    // Count errors point at the count field.
    assert!(matches!(
        expect_err(Raw::header(3, u64::MAX, 0).0),
        GgufError::Truncated { offset: 8, .. }
    ));
    assert!(matches!(
        expect_err(Raw::header(3, 0, u64::MAX).0),
        GgufError::Truncated { offset: 16, .. }
    ));
    // The same array with the 44 bytes it needs parses.
    let ok = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(4)
        .u64(11)
        .zeros(44)
        .0;
    let f = parse(ok).expect("fits exactly");
    assert_eq!(
        f.metadata().get_array("k").map(<[Value]>::len).ok(),
        Some(11)
    );
}

#[test]
fn strings_too_long_or_not_utf8() {
    let huge = Raw::header(3, 0, 1).u64(1 << 40).zeros(16).0;
    assert!(
        matches!(expect_err(huge), GgufError::TooLarge { value, offset: 24, .. } if value == 1 << 40)
    );
    let over_cap = Raw::header(3, 0, 1).str("k").u32(8).u64((16 << 20) + 1).0;
    assert!(matches!(expect_err(over_cap), GgufError::TooLarge { .. }));
    let past_end = Raw::header(3, 0, 1).str("k").u32(8).u64(100).zeros(99).0;
    assert!(matches!(expect_err(past_end), GgufError::Truncated { .. }));

    let bad_key = Raw::header(3, 0, 1)
        .u64(2)
        .bytes(&[0xc3, 0x28])
        .u32(4)
        .u32(1)
        .0;
    match expect_err(bad_key) {
        GgufError::BadUtf8 { what, offset } => {
            assert_eq!(offset, 32);
            assert!(what.contains("key of metadata entry 0"), "{what}");
        }
        other => panic!("{other:?}"),
    }
    let bad_value = Raw::header(3, 0, 1)
        .str("tok")
        .u32(9)
        .u32(8)
        .u64(2)
        .str("ok")
        .u64(1)
        .u8(0xff)
        .0;
    match expect_err(bad_value) {
        GgufError::BadUtf8 { what, .. } => assert!(what.contains("`tok`"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn array_nesting_is_capped_at_four() {
    // `depth` arrays each holding one array, the innermost holding one u8.
    let nested = |depth: usize| {
        let mut r = Raw::header(3, 0, 1).str("deep").u32(9);
        for _ in 1..depth {
            r = r.u32(9).u64(1);
        }
        r.u32(0).u64(1).u8(7).0
    };
    let f = parse(nested(4)).expect("depth 4 is allowed");
    let mut v = f.metadata().get("deep").expect("present");
    for _ in 0..4 {
        v = &v.as_array().expect("array")[0];
    }
    assert_eq!(v, &Value::U8(7));
    match expect_err(nested(5)) {
        GgufError::TooLarge {
            what,
            value: 5,
            limit: 4,
            ..
        } => assert!(what.contains("`deep`")),
        other => panic!("{other:?}"),
    }
    // Deep enough to overflow the stack if depth were not capped.
    assert!(matches!(
        expect_err(nested(100_000)),
        GgufError::TooLarge { .. }
    ));
}

#[test]
fn unknown_value_types() {
    let top = Raw::header(3, 0, 1).str("k").u32(13).u32(0).0;
    assert!(matches!(
        expect_err(top),
        GgufError::UnknownValueType { key, type_id: 13, offset: 33 } if key == "k"
    ));
    let elem = Raw::header(3, 0, 1).str("k").u32(9).u32(99).u64(0).0;
    assert!(matches!(
        expect_err(elem),
        GgufError::UnknownValueType { type_id: 99, .. }
    ));
}

#[test]
fn duplicate_key() {
    let dup = Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).0;
    assert!(matches!(expect_err(dup), GgufError::DuplicateKey { key, offset: 41 } if key == "k"));
}

#[test]
fn alignment_must_be_a_power_of_two_integer() {
    let with_alignment = |value_type: u32, value: &[u8]| {
        Raw::header(3, 1, 1)
            .str("general.alignment")
            .u32(value_type)
            .bytes(value)
            .tensor("w", &[4], 0, 0)
            .pad(64)
            .zeros(16)
            .0
    };
    for bad in [0u32, 3, 48] {
        assert!(matches!(
            expect_err(with_alignment(4, &bad.to_le_bytes())),
            GgufError::BadAlignment { .. }
        ));
    }
    assert!(matches!(
        expect_err(with_alignment(5, &(-32i32).to_le_bytes())),
        GgufError::BadAlignment { .. }
    ));
    assert!(matches!(
        expect_err(with_alignment(8, &Raw(Vec::new()).str("32").0)),
        GgufError::BadAlignment { .. }
    ));
    // A u64 alignment is accepted, and the data section starts on it.
    let f = parse(with_alignment(10, &64u64.to_le_bytes())).expect("u64 alignment");
    assert_eq!((f.alignment(), f.data_offset()), (64, 128));
}

#[test]
fn tensor_shapes() {
    let bad = |bytes: Vec<u8>, needle: &str| match expect_err(bytes) {
        GgufError::BadTensor { tensor, reason } => {
            assert_eq!(tensor, "w");
            assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
        }
        other => panic!("expected BadTensor ({needle}), got {other:?}"),
    };
    bad(one_tensor(&[], 0, 0, 0), "0 dimensions");
    bad(one_tensor(&[1, 1, 1, 1, 1], 0, 0, 4), "5 dimensions");
    bad(one_tensor(&[4, 0], 0, 0, 0), "dimension 1");
    bad(one_tensor(&[u64::MAX, 3], 0, 0, 0), "overflows");
    bad(one_tensor(&[1 << 62], 0, 0, 0), "overflows");
    // Q8_0 (id 8) rows are blocks of 32.
    bad(one_tensor(&[31, 2], 8, 0, 68), "whole number");
    bad(one_tensor(&[16, 2], 8, 0, 34), "whole number");
    assert!(parse(one_tensor(&[32, 2], 8, 0, 68)).is_ok());
    // A huge n_dims must be refused before anything is allocated for the dims.
    let huge_ndims = Raw::header(3, 1, 0).str("w").u32(u32::MAX).zeros(64).0;
    bad(huge_ndims, "4294967295 dimensions");
}

#[test]
fn tensor_types() {
    for id in [4u32, 5, 16, 99, u32::MAX] {
        assert!(matches!(
            expect_err(one_tensor(&[32], id, 0, 4096)),
            GgufError::UnknownTensorType { tensor, type_id } if tensor == "w" && type_id == id
        ));
    }
}

#[test]
fn tensor_ranges() {
    let bad = |bytes: Vec<u8>, needle: &str| match expect_err(bytes) {
        GgufError::BadTensor { reason, .. } => assert!(reason.contains(needle), "{reason:?}"),
        other => panic!("expected BadTensor, got {other:?}"),
    };
    assert!(parse(one_tensor(&[8], 0, 0, 32)).is_ok());
    bad(one_tensor(&[8], 0, 0, 31), "past the end");
    bad(one_tensor(&[8], 0, 32, 32), "past the end");
    bad(
        one_tensor(&[8], 0, 16, 64),
        "not a multiple of the alignment",
    );
    bad(one_tensor(&[8], 0, u64::MAX - 31, 64), "past the end");
    // A size that does not fit the file even though each dim is modest.
    bad(one_tensor(&[1 << 20, 1 << 20], 0, 0, 64), "past the end");
}

#[test]
fn duplicate_tensor_names() {
    let dup = Raw::header(3, 2, 0)
        .tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .zeros(64)
        .0;
    assert!(matches!(expect_err(dup), GgufError::DuplicateTensor(n) if n == "w"));
}

#[test]
fn errors_name_the_field_and_offset() {
    let e = expect_err(Raw::header(3, 0, 1).str("llama.block_count").u32(4).u8(1).0);
    let msg = e.to_string();
    assert!(
        msg.contains("`llama.block_count`") && msg.contains("offset 53"),
        "{msg}"
    );
    let e = expect_err(one_tensor(&[8], 0, 0, 8));
    let msg = e.to_string();
    assert!(
        msg.contains("tensor `w`") && msg.contains("past the end"),
        "{msg}"
    );
}
