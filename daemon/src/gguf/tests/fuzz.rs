//! Mutation fuzzing of the reader (the CI counterpart of the cargo-fuzz target in
//! `fuzz/`): random edits of a valid file must parse or fail cleanly, never panic, and
//! never take more heap than a small multiple of the input.

use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;

use super::alloc_counter::peak_heap_during;
use super::{sample_bytes, Raw};
use crate::gguf::GgufFile;

/// Heap bound for parsing `len` bytes. The worst case is an array of one-byte values:
/// each input byte becomes a 32-byte `Value`. Everything else (strings, tensor infos,
/// the indexes) costs less per input byte; the constant covers small fixed allocations
/// and error messages.
fn heap_limit(len: u64) -> u64 {
    40 * len + 16 * 1024
}

fn seed() -> &'static [u8] {
    static SEED: OnceLock<Vec<u8>> = OnceLock::new();
    SEED.get_or_init(sample_bytes)
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: Index,
        mask: u8,
    },
    Insert {
        at: Index,
        bytes: Vec<u8>,
    },
    Delete {
        at: Index,
        len: usize,
    },
    Truncate {
        at: Index,
    },
    PutU32 {
        at: Index,
        value: u32,
    },
    PutU64 {
        at: Index,
        value: u64,
    },
    /// Overwrites the tensor count (false) or the metadata count (true).
    HeaderCount {
        kv: bool,
        value: u64,
    },
}

/// Values that sit on the reader's boundaries, plus anything.
fn interesting() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(4),
        Just(5),
        Just(9),
        Just(12),
        Just(13),
        Just(31),
        Just(32),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        Just(1 << 40),
        Just(16 << 20),
        Just((16 << 20) + 1),
        0u64..4096,
        any::<u64>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        1 => (any::<Index>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (any::<Index>(), 1usize..32).prop_map(|(at, len)| Mutation::Delete { at, len }),
        1 => any::<Index>().prop_map(|at| Mutation::Truncate { at }),
        2 => (any::<Index>(), interesting())
            .prop_map(|(at, v)| Mutation::PutU32 { at, value: v as u32 }),
        2 => (any::<Index>(), interesting()).prop_map(|(at, value)| Mutation::PutU64 { at, value }),
        1 => (any::<bool>(), interesting()).prop_map(|(kv, value)| Mutation::HeaderCount { kv, value }),
    ]
}

fn put(bytes: &mut [u8], at: usize, value: &[u8]) {
    for (dst, src) in bytes.iter_mut().skip(at).zip(value) {
        *dst = *src;
    }
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let len = bytes.len();
    match m {
        Mutation::Flip { at, mask } => bytes[at.index(len)] ^= mask,
        Mutation::Insert { at, bytes: ins } => {
            let i = at.index(len + 1);
            bytes.splice(i..i, ins.iter().copied());
        }
        Mutation::Delete { at, len: n } => {
            let i = at.index(len);
            bytes.drain(i..(i + n).min(len));
        }
        Mutation::Truncate { at } => bytes.truncate(at.index(len)),
        Mutation::PutU32 { at, value } => put(bytes, at.index(len), &value.to_le_bytes()),
        Mutation::PutU64 { at, value } => put(bytes, at.index(len), &value.to_le_bytes()),
        Mutation::HeaderCount { kv, value } => {
            put(bytes, if *kv { 16 } else { 8 }, &value.to_le_bytes())
        }
    }
}

/// Parses `bytes`, checking the heap bound and, when it parses, that every tensor's data
/// is in range and indexed.
fn check(bytes: Vec<u8>) -> Result<(), TestCaseError> {
    let len = bytes.len() as u64;
    let (result, peak) = peak_heap_during(|| GgufFile::from_bytes(bytes));
    prop_assert!(
        peak <= heap_limit(len),
        "peak heap {peak} for {len} input bytes ({result:?})"
    );
    if let Ok(f) = result {
        prop_assert_eq!(f.metadata().iter().count(), f.metadata().len());
        for t in f.tensors() {
            prop_assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
            prop_assert_eq!((t.offset - f.data_offset()) % f.alignment(), 0);
            prop_assert_eq!(f.tensor(&t.name), Some(t));
        }
    }
    Ok(())
}

proptest! {
    // Failures print the minimal input; nothing is written into the source tree.
    #![proptest_config(ProptestConfig {
        cases: 4000,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn mutated_files_parse_or_fail_cleanly(muts in prop::collection::vec(mutation(), 1..6)) {
        let mut bytes = seed().to_vec();
        for m in &muts {
            apply(&mut bytes, m);
        }
        check(bytes)?;
    }

    #[test]
    fn random_bytes_after_a_valid_prefix(version in 2u32..=3, tail in prop::collection::vec(any::<u8>(), 0..512)) {
        // Random counts and fields right after the magic and version.
        check(Raw(b"GGUF".to_vec()).u32(version).bytes(&tail).0)?;
    }
}

/// The factor in `heap_limit` is the real worst case, not a guess: the densest inputs
/// (one-byte values, empty strings, empty arrays) must fit it, and one-byte values must
/// come close to it, or the bound is too loose to catch a regression.
#[test]
fn densest_inputs_fit_the_heap_bound() {
    let n = 100_000u64;
    let u8_array = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(0)
        .u64(n)
        .zeros(n as usize)
        .0;
    let empty_strings = Raw::header(3, 0, 1)
        .str("k")
        .u32(9)
        .u32(8)
        .u64(n)
        .zeros(8 * n as usize)
        .0;
    let mut empty_arrays = Raw::header(3, 0, 1).str("k").u32(9).u32(9).u64(n);
    for _ in 0..n {
        empty_arrays = empty_arrays.u32(0).u64(0);
    }
    let mut ratios = Vec::new();
    for bytes in [u8_array, empty_strings, empty_arrays.0] {
        let len = bytes.len() as u64;
        let (r, peak) = peak_heap_during(|| GgufFile::from_bytes(bytes));
        assert!(r.is_ok(), "{r:?}");
        assert!(peak <= heap_limit(len), "peak {peak} for {len} bytes");
        ratios.push(peak as f64 / len as f64);
    }
    assert!(
        ratios[0] > 25.0,
        "u8 arrays cost {:.1} bytes per input byte",
        ratios[0]
    );
}
