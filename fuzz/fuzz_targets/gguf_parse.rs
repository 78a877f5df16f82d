//! Fuzzes the GGUF header parser: any input must parse or fail with an error, never
//! panic, hang or allocate without bound; a file that parses must only hand out
//! tensor ranges inside itself.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sparkd::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = GgufFile::from_bytes(data.to_vec()) {
        for t in file.tensors() {
            assert_eq!(file.tensor_data(t).len() as u64, t.n_bytes);
            assert!(file.tensor(&t.name).is_some());
        }
        let _ = file.metadata().iter().count();
    }
});
