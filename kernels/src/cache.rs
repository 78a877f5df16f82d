//! The on-disk PTX cache: compiling every module takes NVRTC seconds, so PTX is kept
//! under `~/.cache/sparkd/ptx/`, keyed by everything that determines it (expanded source,
//! architecture, options, NVRTC version).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::nvrtc::NvrtcVersion;
use crate::Arch;

/// Overrides the cache root (`$SPARKD_CACHE/ptx`), as the wheel installer does.
pub const CACHE_ENV: &str = "SPARKD_CACHE";

/// A directory of cached PTX files.
#[derive(Debug, Clone)]
pub struct PtxCache {
    dir: PathBuf,
}

impl PtxCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        PtxCache { dir: dir.into() }
    }

    /// `$SPARKD_CACHE/ptx`, else `$XDG_CACHE_HOME/sparkd/ptx`, else `~/.cache/sparkd/ptx`;
    /// `None` when none of those variables is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        var(CACHE_ENV)
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("sparkd")))
            .or_else(|| var("HOME").map(|h| h.join(".cache").join("sparkd")))
            .map(|d| d.join("ptx"))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The cache key: a hex SHA-256 over every input of the compilation.
    pub fn key(source: &str, arch: Arch, options: &[String], nvrtc: NvrtcVersion) -> String {
        let mut h = Sha256::new();
        // Length-prefix each field so that no two different inputs hash the same bytes.
        let mut field = |b: &[u8]| {
            h.update((b.len() as u64).to_le_bytes());
            h.update(b);
        };
        field(source.as_bytes());
        field(arch.to_string().as_bytes());
        field(nvrtc.to_string().as_bytes());
        for o in options {
            field(o.as_bytes());
        }
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn path(&self, module: &str, arch: Arch, key: &str) -> PathBuf {
        let stem = module.strip_suffix(".cu").unwrap_or(module);
        self.dir
            .join(format!("{stem}.{arch}.{}.ptx", &key[..key.len().min(32)]))
    }

    /// Cached PTX for the key, if present and plausible (a truncated file from a crash
    /// is treated as a miss).
    pub fn load(&self, module: &str, arch: Arch, key: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.path(module, arch, key)).ok()?;
        looks_like_ptx(&text).then_some(text)
    }

    /// Stores PTX atomically (temporary file, then rename), so readers never see a
    /// partial file.
    pub fn store(&self, module: &str, arch: Arch, key: &str, ptx: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let dest = self.path(module, arch, key);
        let tmp = self
            .dir
            .join(format!(".{}.{}.tmp", module, std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(ptx.as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &dest).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

/// NVRTC's PTX names its target and ends its last entry; anything else is damaged.
fn looks_like_ptx(text: &str) -> bool {
    text.contains(".target ") && text.contains(".version ") && text.trim_end().ends_with('}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(major: u32, minor: u32) -> NvrtcVersion {
        NvrtcVersion { major, minor }
    }

    #[test]
    fn key_changes_with_every_input() {
        let a90: Arch = "sm_90".parse().unwrap();
        let a121: Arch = "sm_121".parse().unwrap();
        let opts = vec!["--std=c++17".to_string()];
        let base = PtxCache::key("src", a90, &opts, v(13, 0));
        assert_eq!(base, PtxCache::key("src", a90, &opts, v(13, 0)));
        assert_eq!(base.len(), 64);
        assert_ne!(base, PtxCache::key("src ", a90, &opts, v(13, 0)));
        assert_ne!(base, PtxCache::key("src", a121, &opts, v(13, 0)));
        assert_ne!(base, PtxCache::key("src", a90, &opts, v(13, 1)));
        assert_ne!(base, PtxCache::key("src", a90, &[], v(13, 0)));
        // Field boundaries matter: ["ab"] and ["a", "b"] differ.
        let ab = PtxCache::key("s", a90, &["ab".into()], v(13, 0));
        let a_b = PtxCache::key("s", a90, &["a".into(), "b".into()], v(13, 0));
        assert_ne!(ab, a_b);
    }

    #[test]
    fn stores_and_loads_and_rejects_damaged_files() {
        let dir = std::env::temp_dir().join(format!("sparkd-ptx-cache-{}", std::process::id()));
        let cache = PtxCache::new(&dir);
        let arch: Arch = "sm_90".parse().unwrap();
        let key = PtxCache::key("x", arch, &[], v(13, 0));
        assert_eq!(cache.load("m.cu", arch, &key), None);
        let ptx = "//\n.version 9.0\n.target sm_90\n.visible .entry k()\n{\n}\n";
        cache.store("m.cu", arch, &key, ptx).unwrap();
        assert_eq!(cache.load("m.cu", arch, &key).as_deref(), Some(ptx));
        // Truncated file: a miss, not garbage handed to the driver.
        let path = cache.path("m.cu", arch, &key);
        std::fs::write(&path, &ptx[..20]).unwrap();
        assert_eq!(cache.load("m.cu", arch, &key), None);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(left.len(), 1, "no temporary files left behind");
    }
}
