//! The on-disk kernel cache: compiling every module takes NVRTC tens of seconds, so the
//! cubins are kept under `~/.cache/sparkd/kernels/`, keyed by everything that determines
//! them (expanded source, architecture, options, NVRTC version).

use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::nvrtc::NvrtcVersion;
use crate::{unique_suffix, Arch};

/// Overrides the cache root (`$SPARKD_CACHE/kernels`), as the wheel installer and the
/// systemd unit do.
pub const CACHE_ENV: &str = "SPARKD_CACHE";

/// A directory of cached cubins.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
}

impl KernelCache {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        KernelCache { dir: dir.into() }
    }

    /// `$SPARKD_CACHE/kernels`, else `$XDG_CACHE_HOME/sparkd/kernels`, else
    /// `~/.cache/sparkd/kernels`; `None` when none of those variables is set.
    pub fn default_dir() -> Option<PathBuf> {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        var(CACHE_ENV)
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("sparkd")))
            .or_else(|| var("HOME").map(|h| h.join(".cache").join("sparkd")))
            .map(|d| d.join("kernels"))
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

    /// `unit` is a module's file name, or a part of one (`matvec.cu:q4_k`).
    fn path(&self, unit: &str, arch: Arch, key: &str) -> PathBuf {
        let stem = unit.replace(".cu", "").replace(':', ".");
        self.dir
            .join(format!("{stem}.{arch}.{}.cubin", &key[..key.len().min(32)]))
    }

    /// Deletes the PTX cache of sparkd versions that loaded PTX (`ptx/` beside this
    /// cache's `kernels/`), which nothing reads any more. Only a folder holding nothing
    /// but `.ptx` files (and a compile's temporaries) goes; the count removed is returned.
    pub fn remove_legacy_ptx(&self) -> usize {
        let Some(root) = self.dir.parent().filter(|_| self.dir.ends_with("kernels")) else {
            return 0;
        };
        let legacy = root.join("ptx");
        let Ok(entries) = std::fs::read_dir(&legacy) else {
            return 0;
        };
        let names: Vec<_> = entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        let ours = |n: &std::ffi::OsStr| {
            let n = n.to_string_lossy();
            n.ends_with(".ptx") || (n.starts_with('.') && n.ends_with(".tmp"))
        };
        if !names.iter().all(|n| ours(n)) || std::fs::remove_dir_all(&legacy).is_err() {
            return 0;
        }
        names.len()
    }

    /// The cached image for the key, if any. The caller checks that it is a whole cubin
    /// for the architecture (`KernelImage::new`) before handing it to the driver.
    pub fn load(&self, unit: &str, arch: Arch, key: &str) -> Option<Vec<u8>> {
        std::fs::read(self.path(unit, arch, key)).ok()
    }

    /// Stores an image atomically (temporary file, then rename), so readers never see a
    /// partial file.
    pub fn store(&self, unit: &str, arch: Arch, key: &str, image: &[u8]) -> std::io::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        let dest = self.path(unit, arch, key);
        // Unique per process and call: two compilers in one process may store the same
        // module at once.
        let tmp = self.dir.join(format!(".{unit}.{}.tmp", unique_suffix()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(image)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&tmp, &dest).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
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
        let base = KernelCache::key("src", a90, &opts, v(13, 0));
        assert_eq!(base, KernelCache::key("src", a90, &opts, v(13, 0)));
        assert_eq!(base.len(), 64);
        assert_ne!(base, KernelCache::key("src ", a90, &opts, v(13, 0)));
        assert_ne!(base, KernelCache::key("src", a121, &opts, v(13, 0)));
        assert_ne!(base, KernelCache::key("src", a90, &opts, v(13, 1)));
        assert_ne!(base, KernelCache::key("src", a90, &[], v(13, 0)));
        // Field boundaries matter: ["ab"] and ["a", "b"] differ.
        let ab = KernelCache::key("s", a90, &["ab".into()], v(13, 0));
        let a_b = KernelCache::key("s", a90, &["a".into(), "b".into()], v(13, 0));
        assert_ne!(ab, a_b);
    }

    #[test]
    fn the_legacy_ptx_folder_goes_only_when_it_holds_nothing_but_ptx() {
        let root = std::env::temp_dir().join(format!("sparkd-legacy-{}", std::process::id()));
        let cache = KernelCache::new(root.join("kernels"));
        let legacy = root.join("ptx");
        assert_eq!(cache.remove_legacy_ptx(), 0, "no folder");
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join("matvec.sm_90.abc.ptx"), "x").unwrap();
        std::fs::write(legacy.join("notes.txt"), "mine").unwrap();
        assert_eq!(cache.remove_legacy_ptx(), 0, "a file that is not ours");
        assert!(legacy.join("notes.txt").exists());
        std::fs::remove_file(legacy.join("notes.txt")).unwrap();
        std::fs::write(legacy.join(".matvec.cu.12.tmp"), "x").unwrap();
        assert_eq!(cache.remove_legacy_ptx(), 2);
        assert!(!legacy.exists());
        // A cache folder of another name never touches its neighbours.
        std::fs::create_dir_all(&legacy).unwrap();
        std::fs::write(legacy.join("a.ptx"), "x").unwrap();
        assert_eq!(
            KernelCache::new(root.join("elsewhere")).remove_legacy_ptx(),
            0
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn stores_and_loads_without_leaving_temporary_files() {
        let dir = std::env::temp_dir().join(format!("sparkd-kernel-cache-{}", std::process::id()));
        let cache = KernelCache::new(&dir);
        let arch: Arch = "sm_90".parse().unwrap();
        let key = KernelCache::key("x", arch, &[], v(13, 0));
        assert_eq!(cache.load("m.cu", arch, &key), None);
        let image = b"\x7fELF not really".to_vec();
        cache.store("m.cu", arch, &key, &image).unwrap();
        cache.store("m.cu", arch, &key, &image).unwrap();
        assert_eq!(cache.load("m.cu", arch, &key), Some(image));
        let other = KernelCache::key("x", "sm_121".parse().unwrap(), &[], v(13, 0));
        assert_eq!(cache.load("m.cu", arch, &other), None);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(left.len(), 1, "no temporary files left behind");
    }
}
