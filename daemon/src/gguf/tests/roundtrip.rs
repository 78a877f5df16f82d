//! Writer -> reader round trips, and the writer refusing what it cannot encode.

use super::{pattern, sample_writer};
use crate::gguf::{GgufError, GgufFile, GgufWriter, Value};
use crate::quant::GgmlType;

fn parse(w: &GgufWriter) -> GgufFile {
    match GgufFile::from_bytes(w.to_bytes()) {
        Ok(f) => f,
        Err(e) => panic!("writer output failed to parse: {e}"),
    }
}

/// Every scalar type at its edges, strings, arrays of every type, empty and nested.
fn all_values() -> Vec<(String, Value)> {
    let scalars = vec![
        Value::U8(u8::MAX),
        Value::I8(i8::MIN),
        Value::U16(u16::MAX),
        Value::I16(i16::MIN),
        Value::U32(u32::MAX),
        Value::I32(i32::MIN),
        Value::U64(u64::MAX),
        Value::I64(i64::MIN),
        Value::F32(-0.0),
        Value::F32(f32::MIN_POSITIVE / 2.0),
        Value::F64(std::f64::consts::PI),
        Value::F64(f64::INFINITY),
        Value::Bool(false),
        Value::Bool(true),
        Value::String(String::new()),
        Value::String("ünïcödé ▁ 🦀 {{ bos_token }}\n".into()),
    ];
    let mut out: Vec<(String, Value)> = Vec::new();
    for (i, v) in scalars.iter().enumerate() {
        out.push((format!("scalar.{i}.{}", v.type_name()), v.clone()));
        // The same type as a 3-element array.
        out.push((
            format!("array.{i}.{}", v.type_name()),
            Value::Array(vec![v.clone(), v.clone(), v.clone()]),
        ));
    }
    out.push(("array.empty".into(), Value::Array(Vec::new())));
    out.push((
        "array.nested4".into(),
        vec![vec![vec![vec![1i64, -2]], vec![vec![3]]], vec![]].into(),
    ));
    out.push((
        "array.mixed_inner_types".into(),
        Value::Array(vec![
            Value::Array(vec![Value::U8(1)]),
            Value::Array(vec!["a".into(), "b".into()]),
            Value::Array(Vec::new()),
        ]),
    ));
    out
}

/// Values compared by bits, so -0.0 and subnormals are checked exactly.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        _ => a == b,
    }
}

#[test]
fn every_value_type_round_trips_in_order() {
    let values = all_values();
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.add(k.clone(), v.clone());
    }
    let f = parse(&w);
    assert_eq!(f.version(), 3);
    assert_eq!(f.metadata().len(), values.len());
    for ((k, v), (rk, rv)) in values.iter().zip(f.metadata().iter()) {
        assert_eq!(k, rk);
        assert!(same(v, rv), "`{k}`: wrote {v:?}, read {rv:?}");
    }
    assert!(f.tensors().is_empty());
}

#[test]
fn re_adding_a_key_replaces_its_value_in_place() {
    let mut w = GgufWriter::new();
    w.add("a", Value::U32(1));
    w.add("b", Value::U32(2));
    w.add("a", "now a string".into());
    let f = parse(&w);
    let keys: Vec<_> = f.metadata().iter().map(|(k, _)| k).collect();
    assert_eq!(keys, ["a", "b"]);
    assert_eq!(f.metadata().get_str("a").ok(), Some("now a string"));
}

#[test]
fn tensors_round_trip_with_aligned_offsets() {
    for alignment in [1u64, 8, 32, 64, 4096] {
        let shapes: [(&str, Vec<u64>, GgmlType); 6] = [
            ("f32", vec![5, 3], GgmlType::F32),
            ("f16", vec![7], GgmlType::F16),
            ("bf16", vec![2, 2, 2, 2], GgmlType::BF16),
            ("q8_0", vec![64, 3], GgmlType::Q8_0),
            ("q4_1", vec![32, 2, 1], GgmlType::Q4_1),
            ("q4_k", vec![256, 2], GgmlType::Q4_K),
        ];
        let mut w = GgufWriter::new().with_alignment(alignment);
        w.add("general.architecture", "test".into());
        let mut expected = Vec::new();
        for (i, (name, dims, ty)) in shapes.into_iter().enumerate() {
            let n = ty.bytes_for(dims.iter().product()).expect("whole blocks");
            let data = pattern(n as usize, i as u64 + alignment);
            w.add_tensor(name, dims.clone(), ty, data.clone())
                .expect("valid tensor");
            expected.push((name, dims, ty, data));
        }
        let f = parse(&w);
        assert_eq!(f.alignment(), alignment);
        assert_eq!(f.data_offset() % alignment, 0);
        assert_eq!(f.tensors().len(), expected.len());
        for (t, (name, dims, ty, data)) in f.tensors().iter().zip(&expected) {
            assert_eq!(&t.name, name);
            assert_eq!(&t.dims, dims);
            assert_eq!(t.ty, *ty);
            assert_eq!(t.n_bytes, data.len() as u64);
            assert_eq!((t.offset - f.data_offset()) % alignment, 0, "{name}");
            assert_eq!(
                f.tensor_data(t),
                &data[..],
                "{name} at alignment {alignment}"
            );
            let in_memory = alignment.min(64) as usize;
            assert_eq!(f.tensor_data(t).as_ptr().addr() % in_memory, 0, "{name}");
            assert_eq!(f.tensor(name), Some(t));
        }
        assert_eq!(f.tensor("absent"), None);
        assert!(
            matches!(f.require_tensor("absent"), Err(GgufError::MissingTensor(n)) if n == "absent")
        );
        // The writer pads after the last tensor, as the Python gguf writer does.
        assert_eq!(f.file_len() % alignment, 0);
    }
}

#[test]
fn tensor_data_of_a_foreign_info_is_empty_not_a_panic() {
    let f = parse(&sample_writer());
    let mut t = f.tensors()[0].clone();
    t.offset = f.file_len();
    assert!(f.tensor_data(&t).is_empty());
    t.offset = u64::MAX;
    assert!(f.tensor_data(&t).is_empty());
}

#[test]
fn write_file_replaces_atomically_and_opens_mapped() {
    let dir = std::env::temp_dir().join(format!("sparkd-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("sample.gguf");
    std::fs::write(&path, b"old contents").expect("seed file");

    let w = sample_writer();
    w.write_file(&path).expect("write_file");
    let f = GgufFile::open(&path).expect("open");
    assert!(f.is_mapped());
    assert_eq!(f.bytes(), &w.to_bytes()[..]);
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .filter(|n| n != "sample.gguf")
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    let missing = dir.join("no-such-dir").join("x.gguf");
    assert!(matches!(w.write_file(&missing), Err(GgufError::Io { .. })));
    assert!(matches!(
        GgufFile::open(&missing),
        Err(GgufError::Io { path, .. }) if path == missing
    ));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn load_copies_the_file_and_ignores_later_changes_to_it() {
    let dir = std::env::temp_dir().join(format!("sparkd-gguf-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("model.gguf");
    let w = sample_writer();
    let bytes = w.to_bytes();
    std::fs::write(&path, &bytes).expect("write");

    let f = GgufFile::load(&path).expect("load");
    assert!(!f.is_mapped());
    assert_eq!(f.bytes(), &bytes[..]);
    let t = &f.tensors()[0];
    let data = f.tensor_data(t).to_vec();
    // Rewritten in place, then truncated: a mapping would change or fault (SIGBUS);
    // the copy does neither.
    std::fs::write(&path, vec![0xAB; bytes.len()]).expect("overwrite");
    assert_eq!(f.tensor_data(t), &data[..]);
    std::fs::write(&path, b"").expect("truncate");
    assert_eq!(f.bytes(), &bytes[..]);

    // Loading the now-empty file is a clear error.
    assert!(matches!(
        GgufFile::load(&path),
        Err(GgufError::Truncated { .. })
    ));
    let missing = dir.join("missing.gguf");
    assert!(matches!(
        GgufFile::load(&missing),
        Err(GgufError::Io { path, .. }) if path == missing
    ));
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn add_tensor_checks_shape_and_size() {
    let mut w = GgufWriter::new();
    let bad = |r: Result<(), GgufError>| matches!(r, Err(GgufError::BadTensor { tensor, .. }) if tensor == "t");
    assert!(bad(w.add_tensor("t", vec![4], GgmlType::F32, vec![0; 15])));
    assert!(bad(w.add_tensor("t", vec![], GgmlType::F32, vec![])));
    assert!(bad(w.add_tensor(
        "t",
        vec![1, 1, 1, 1, 1],
        GgmlType::F32,
        vec![0; 4]
    )));
    assert!(bad(w.add_tensor("t", vec![4, 0], GgmlType::F32, vec![])));
    // 16 elements of Q8_0 is half a block.
    assert!(bad(w.add_tensor(
        "t",
        vec![16, 2],
        GgmlType::Q8_0,
        vec![0; 34]
    )));
    assert!(bad(w.add_tensor(
        "t",
        vec![u64::MAX, 2],
        GgmlType::F32,
        vec![]
    )));
    assert!(w
        .add_tensor("t", vec![4], GgmlType::F32, vec![0; 16])
        .is_ok());
    assert!(matches!(
        w.add_tensor("t", vec![4], GgmlType::F32, vec![0; 16]),
        Err(GgufError::DuplicateTensor(n)) if n == "t"
    ));
}

#[test]
fn writer_refuses_values_it_cannot_encode() {
    let cases: Vec<(&str, GgufWriter)> = vec![
        ("mixed array", {
            let mut w = GgufWriter::new();
            w.add("k", Value::Array(vec![Value::U8(1), Value::I8(1)]));
            w
        }),
        ("depth 5", {
            let mut w = GgufWriter::new();
            w.add("k", vec![vec![vec![vec![vec![1u8]]]]].into());
            w
        }),
        ("alignment 0", GgufWriter::new().with_alignment(0)),
        ("alignment 24", GgufWriter::new().with_alignment(24)),
        ("alignment as a string", {
            let mut w = GgufWriter::new();
            w.add("general.alignment", "32".into());
            w
        }),
    ];
    for (what, w) in cases {
        let mut out = Vec::new();
        let err = w.write_to(&mut out).expect_err(what);
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{what}");
        assert!(out.is_empty(), "{what}: wrote before failing");
        let path = std::env::temp_dir().join("sparkd-gguf-never-written.gguf");
        assert!(
            matches!(w.write_file(&path), Err(GgufError::Unencodable(_))),
            "{what}"
        );
        assert!(!path.exists(), "{what}");
    }
}

#[test]
fn releasing_a_tensor_of_the_private_copy_leaves_its_neighbours_intact() {
    let dir = std::env::temp_dir().join(format!("sparkd-gguf-release-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("model.gguf");
    let mut w = GgufWriter::new();
    // Sizes that are not multiples of a page, so the tensors share pages at their edges.
    let a: Vec<u8> = (0..3001 * 4).map(|i| (i % 251) as u8 | 1).collect();
    let b: Vec<u8> = (0..2999 * 4).map(|i| (i % 241) as u8 | 1).collect();
    let c: Vec<u8> = (0..5003 * 4).map(|i| (i % 239) as u8 | 1).collect();
    for (name, data) in [("a", &a), ("b", &b), ("c", &c)] {
        w.add_tensor(
            name,
            vec![(data.len() / 4) as u64],
            GgmlType::F32,
            data.clone(),
        )
        .unwrap();
    }
    w.write_file(&path).expect("write");
    let f = GgufFile::load(&path).expect("load");
    let t = |n: &str| f.tensor(n).unwrap().clone();
    let (ta, tb, tc) = (t("a"), t("b"), t("c"));
    f.release_pages(tb.offset as usize, tb.n_bytes as usize);
    assert_eq!(f.tensor_data(&ta), &a[..]);
    assert_eq!(f.tensor_data(&tc), &c[..]);
    // The middle of b (whole pages inside it) was given back and reads as zeros; its
    // edges, on pages shared with a and c, kept their bytes.
    let data = f.tensor_data(&tb);
    assert!(data.contains(&0), "no page of b was released");
    assert_eq!(data[0], b[0]);
    assert_eq!(data[data.len() - 1], b[b.len() - 1]);
    std::fs::remove_dir_all(&dir).expect("clean up");
}
