//! What the integration tests share: finding the default model and the vocabulary-only
//! test files on this machine, and loading a tokenizer from either.

use std::path::{Path, PathBuf};

use spark_client::protocol::ToolSpec;
use sparkd::gguf::GgufFile;
use sparkd::text::{Tokenizer, TokenizerSpec};

pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct.gguf";

fn home() -> Option<PathBuf> {
    std::env::var_os("HOME").map(PathBuf::from)
}

/// `file` in the first of `dirs` (those that are set) that holds it.
fn find_file(dirs: [Option<PathBuf>; 3], file: &str) -> Option<PathBuf> {
    dirs.into_iter()
        .flatten()
        .map(|d| d.join(file))
        .find(|p| p.is_file())
}

/// The default model, looked up like the daemon does.
pub fn model_path(file: &str) -> Option<PathBuf> {
    let dirs = [
        std::env::var_os("SPARKD_MODELS").map(PathBuf::from),
        std::env::var_os("XDG_DATA_HOME").map(|d| PathBuf::from(d).join("sparkd/models")),
        home().map(|h| h.join(".local/share/sparkd/models")),
    ];
    find_file(dirs, file)
}

/// Vocabulary-only files made by `make_vocab_ggufs.py`.
pub fn test_vocab_path(file: &str) -> Option<PathBuf> {
    let dirs = [
        std::env::var_os("SPARKD_TEST_VOCABS").map(PathBuf::from),
        std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("sparkd/test-vocabs")),
        home().map(|h| h.join(".cache/sparkd/test-vocabs")),
    ];
    find_file(dirs, file)
}

pub fn load_tokenizer(path: &Path) -> Tokenizer {
    let file = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let spec = TokenizerSpec::from_gguf(file.metadata()).expect("tokenizer metadata");
    Tokenizer::new(spec).expect("tokenizer")
}

/// The real chat templates `scripts/fetch-template-corpus.sh` fetches.
#[allow(dead_code)] // Each test binary uses its own part of this module.
pub fn template_corpus_dir() -> Option<PathBuf> {
    const FOLDER: &str = "sparkd/chat-templates/llama-cpp-python-0.3.36";
    if let Some(dir) = std::env::var_os("SPARKD_TEMPLATE_CORPUS") {
        return Some(PathBuf::from(dir));
    }
    let caches = [
        std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join(FOLDER)),
        home().map(|h| h.join(".cache").join(FOLDER)),
    ];
    // The script marks a finished fetch.
    caches
        .into_iter()
        .flatten()
        .find(|d| d.join(".complete").is_file())
}

/// The tool the chat-template tests offer: `get_weather(city)`.
#[allow(dead_code)] // Each test binary uses its own part of this module.
pub fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: "The weather in a city".into(),
        parameters:
            r#"{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}"#
                .into(),
        strict: false,
    }
}
