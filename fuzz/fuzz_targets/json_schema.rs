//! Fuzzes JSON-schema output: the input's first line is a schema, the rest a text fed to
//! the acceptor byte by byte. Compiling must succeed or explain, and reading must accept
//! or refuse, never panic or hang.

#![no_main]

use libfuzzer_sys::fuzz_target;
use sparkd::text::schema::{FrameStack, Schema, SchemaState};

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(data.len());
    let Ok(schema_text) = std::str::from_utf8(&data[..split]) else {
        return;
    };
    let Ok(schema) = Schema::compile(schema_text) else {
        return;
    };
    let mut frames = FrameStack::default();
    let mut state = SchemaState::new(&schema);
    for &b in data.get(split + 1..).unwrap_or_default() {
        if !state.feed(&schema, &mut frames, b) {
            break;
        }
    }
});
