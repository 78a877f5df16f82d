//! Notices when the model file on disk changes after it was loaded. The daemon serves
//! from its own copy of the weights (`GgufFile::load`), so a replaced, rewritten or
//! deleted file changes nothing it serves; the operator is told once per change that a
//! restart is needed to pick the new file up.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the file is looked at: one `stat`, far below any measurable cost.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// What identifies the file's contents cheaply: which inode, its size and mtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileIdentity {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl FileIdentity {
    pub fn of(path: &Path) -> std::io::Result<FileIdentity> {
        let m = std::fs::metadata(path)?;
        Ok(FileIdentity {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
        })
    }
}

/// How the file differs from what was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Another file now has the name (replaced by rename, as downloads and `spark pull` do).
    Replaced,
    /// The same file, rewritten or truncated in place.
    Rewritten,
    Removed,
}

impl Change {
    fn describe(self) -> &'static str {
        match self {
            Change::Replaced => "replaced by another file",
            Change::Rewritten => "rewritten in place",
            Change::Removed => "removed",
        }
    }
}

/// `now` is `None` when the file cannot be looked at (gone, or its folder unreadable).
pub fn compare(loaded: &FileIdentity, now: Option<FileIdentity>) -> Option<Change> {
    match now {
        None => Some(Change::Removed),
        Some(now) if (now.dev, now.ino) != (loaded.dev, loaded.ino) => Some(Change::Replaced),
        Some(now) if now != *loaded => Some(Change::Rewritten),
        Some(_) => None,
    }
}

/// Logs a warning each time the file at `path` moves away from `loaded` (once per
/// distinct state, not every check), until `shutdown`.
pub async fn watch(path: PathBuf, loaded: FileIdentity, shutdown: CancellationToken) {
    // The state last seen: the loaded one until something changes.
    let mut seen = Some(loaded);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(CHECK_EVERY) => {}
        }
        let now = FileIdentity::of(&path).ok();
        if now == seen {
            continue;
        }
        match compare(&loaded, now) {
            Some(change) => tracing::warn!(
                path = %path.display(),
                "the model file was {} after it was loaded; sparkd keeps serving the weights it \
                 loaded at start (restart it to load the file as it is now)",
                change.describe()
            ),
            None => tracing::info!(
                path = %path.display(),
                "the model file is back as it was loaded"
            ),
        }
        seen = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_replaced_rewritten_and_removed_apart() {
        let dir = std::env::temp_dir().join(format!("sparkd-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        std::fs::write(&path, b"weights").unwrap();
        let loaded = FileIdentity::of(&path).unwrap();
        assert_eq!(compare(&loaded, FileIdentity::of(&path).ok()), None);

        std::fs::write(&path, b"other weights").unwrap();
        assert_eq!(
            compare(&loaded, FileIdentity::of(&path).ok()),
            Some(Change::Rewritten)
        );

        let next = dir.join("m.gguf.new");
        std::fs::write(&next, b"weights").unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(
            compare(&loaded, FileIdentity::of(&path).ok()),
            Some(Change::Replaced)
        );

        std::fs::remove_file(&path).unwrap();
        assert_eq!(
            compare(&loaded, FileIdentity::of(&path).ok()),
            Some(Change::Removed)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
