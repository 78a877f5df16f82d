//! Files from the reference Python writer (llama.cpp's gguf-py), read by our reader
//! and rewritten byte-for-byte by our writer. `fixtures/make_python_fixture.py` made
//! the fixture.

use crate::gguf::{GgufFile, GgufWriter, Value};
use crate::quant::GgmlType;
use half::f16;

const PYTHON_FILE: &[u8] = include_bytes!("fixtures/python-writer.gguf");

fn python_file() -> GgufFile {
    GgufFile::from_bytes(PYTHON_FILE.to_vec()).expect("python-written file parses")
}

#[test]
fn reads_a_file_from_the_python_writer() {
    let f = python_file();
    let md = f.metadata();
    assert_eq!(f.version(), 3);
    assert_eq!(md.get_str("general.architecture").ok(), Some("llama"));
    assert_eq!(md.get_u32("llama.block_count").ok(), Some(2));
    assert_eq!(md.get("test.i32"), Some(&Value::I32(-7)));
    assert_eq!(md.get_u64("test.u64").ok(), Some(1 << 40));
    assert_eq!(md.get_f32("test.f32").ok(), Some(0.5));
    assert_eq!(md.get("test.f64"), Some(&Value::F64(-2.25)));
    assert_eq!(md.get_bool("test.bool").ok(), Some(true));
    assert_eq!(md.get_str("test.str").ok(), Some("héllo ▁"));
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").ok(),
        Some(vec!["<s>", "a", "b"])
    );
    assert_eq!(
        md.get_f32_array("tokenizer.ggml.scores").ok(),
        Some(vec![0.0, -1.0, -2.0])
    );
    assert_eq!(
        md.get_i32_array("tokenizer.ggml.token_type").ok(),
        Some(vec![3, 1, 1])
    );
    assert_eq!(
        md.get("test.nested"),
        Some(&Value::Array(vec![vec![1i32, 2].into(), vec![3i32].into()]))
    );

    // numpy shape (2, 32) is ggml dims [32, 2].
    let t = f.tensor("f32.weight").expect("f32.weight");
    assert_eq!((t.ty, t.dims.as_slice()), (GgmlType::F32, &[32u64, 2][..]));
    let values: Vec<f32> = f
        .tensor_data(t)
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(values, (0..64).map(|i| i as f32).collect::<Vec<_>>());

    let t = f.tensor("f16.weight").expect("f16.weight");
    assert_eq!((t.ty, t.dims.as_slice()), (GgmlType::F16, &[8u64][..]));
    let values: Vec<f32> = f
        .tensor_data(t)
        .chunks_exact(2)
        .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
        .collect();
    assert_eq!(values, (0..8).map(|i| i as f32).collect::<Vec<_>>());
}

#[test]
fn our_writer_reproduces_the_python_file_exactly() {
    let f = python_file();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        w.add(k, v.clone());
    }
    for t in f.tensors() {
        w.add_tensor(
            t.name.clone(),
            t.dims.clone(),
            t.ty,
            f.tensor_data(t).to_vec(),
        )
        .expect("tensor from a valid file");
    }
    assert_eq!(w.to_bytes(), PYTHON_FILE);
}
