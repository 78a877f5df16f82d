//! The only code that touches NVRTC: finding the library without panicking, and
//! compiling one translation unit to SASS (a cubin) and PTX along with NVRTC's log.
//!
//! cudarc loads `libnvrtc` lazily by name and panics when it is missing, so every entry
//! point here first goes through [`load`], which checks with cudarc's own probe
//! (`is_culib_present`) and turns absence into [`KernelError::NvrtcNotFound`].

use std::ffi::{c_char, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cudarc::nvrtc::{result, sys};

use crate::KernelError;

/// Names a `libnvrtc.so.13` to use, e.g. the one scripts/install-cuda-wheels.sh installs.
pub const NVRTC_LIB_ENV: &str = "SPARKD_NVRTC_LIB";

/// NVRTC's version, as reported by `nvrtcVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NvrtcVersion {
    pub major: u32,
    pub minor: u32,
}

impl std::fmt::Display for NvrtcVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Libraries loaded from an explicit path. They stay loaded for the life of the process:
/// cudarc's later `dlopen("libnvrtc.so.13")` then resolves to them by soname.
static PRELOADED: OnceLock<Vec<libloading::Library>> = OnceLock::new();
static LOADED: OnceLock<Result<NvrtcVersion, String>> = OnceLock::new();

/// Makes NVRTC usable, once per process, and returns its version. Honours
/// `SPARKD_NVRTC_LIB`; otherwise the dynamic loader's usual search (LD_LIBRARY_PATH,
/// ld.so.cache) finds the library. Never panics when the library is absent.
pub fn load() -> Result<NvrtcVersion, KernelError> {
    let r = LOADED.get_or_init(|| try_load().map_err(|e| e.to_string()));
    match r {
        Ok(v) => Ok(*v),
        // Recreate the typed error on every call; the first one's text is kept.
        Err(_) => try_load(),
    }
}

fn try_load() -> Result<NvrtcVersion, KernelError> {
    if let Some(path) = std::env::var_os(NVRTC_LIB_ENV).filter(|p| !p.is_empty()) {
        preload(Path::new(&path))?;
    }
    // SAFETY: loading NVRTC runs its initialisers; it is the library we are asked to use.
    if !unsafe { sys::is_culib_present() } {
        let mut candidates = cudarc::get_lib_name_candidates("nvrtc");
        candidates.sort();
        candidates.dedup();
        return Err(KernelError::NvrtcNotFound { candidates });
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present (checked above), so cudarc's lazy loader finds it;
    // the two out-pointers are valid for the call.
    let rc = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    rc.result().map_err(|e| KernelError::Nvrtc {
        call: "nvrtcVersion",
        code: format!("{:?}", e.0),
    })?;
    Ok(NvrtcVersion {
        major: major.max(0) as u32,
        minor: minor.max(0) as u32,
    })
}

/// Loads `path` (and the `libnvrtc-builtins` beside it, which NVRTC itself opens by
/// name at compile time) so that later loads by soname find them.
fn preload(path: &Path) -> Result<(), KernelError> {
    let fail = |reason: String| KernelError::NvrtcLoad {
        env: NVRTC_LIB_ENV,
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_file() {
        return Err(fail("no such file".into()));
    }
    if PRELOADED.get().is_some() {
        return Ok(());
    }
    let mut libs = Vec::new();
    let mut paths: Vec<PathBuf> = builtins_beside(path);
    paths.push(path.to_path_buf());
    for p in paths {
        // SAFETY: runs the library's initialisers; the user pointed us at it.
        let lib = unsafe { libloading::Library::new(&p) }.map_err(|e| fail(e.to_string()))?;
        libs.push(lib);
    }
    // A concurrent caller may have won the race; its libraries are the same files.
    let _ = PRELOADED.set(libs);
    Ok(())
}

/// `libnvrtc-builtins.so.*` files in the directory of `lib` (not the `.alt.` variants,
/// which NVRTC only uses on request).
fn builtins_beside(lib: &Path) -> Vec<PathBuf> {
    let Some(dir) = lib.parent() else {
        return Vec::new();
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so") && !n.contains(".alt."))
        })
        .collect();
    found.sort();
    found
}

/// What one NVRTC compilation for a real architecture (`sm_NN`) produced.
#[derive(Debug, Clone)]
pub struct Output {
    /// The intermediate PTX, for tests that inspect the code.
    pub ptx: String,
    /// The SASS image the driver loads.
    pub cubin: Vec<u8>,
    /// NVRTC's log: warnings on success (empty when clean).
    pub log: String,
}

/// Destroys the program however compilation ends.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by create_program and destroyed only here. A failure to free
        // leaks a little memory; nothing to do about it in a destructor.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

/// Compiles `source` (a complete translation unit named `name`) with `options`.
/// Compilation failures carry NVRTC's log.
pub fn compile(
    name: &str,
    arch_label: &str,
    source: &str,
    options: &[String],
) -> Result<Output, KernelError> {
    load()?;
    let nul = |what| KernelError::NulByte {
        module: name.to_string(),
        what,
    };
    let src = CString::new(source).map_err(|_| nul("source"))?;
    let cname = CString::new(name).map_err(|_| nul("name"))?;
    // cudarc unwraps CString::new on each option: reject NULs here instead.
    if options.iter().any(|o| o.contains('\0')) {
        return Err(nul("a compile option"));
    }
    let nvrtc_err = |call: &'static str| {
        move |e: result::NvrtcError| KernelError::Nvrtc {
            call,
            code: format!("{:?}", e.0),
        }
    };
    let prog = Program(
        result::create_program(&src, Some(&cname)).map_err(nvrtc_err("nvrtcCreateProgram"))?,
    );
    // SAFETY: `prog.0` is a live program (destroyed only when `prog` drops, after these
    // calls); `src` and `cname` outlive it.
    let compiled = unsafe { result::compile_program(prog.0, options) };
    let log = unsafe { result::get_program_log(prog.0) }
        .map(|raw| c_chars_to_string(&raw))
        .map_err(nvrtc_err("nvrtcGetProgramLog"))?;
    if compiled.is_err() {
        return Err(KernelError::Compile {
            module: name.to_string(),
            arch: arch_label.to_string(),
            log,
        });
    }
    let ptx = unsafe { result::get_ptx(prog.0) }
        .map(|raw| c_chars_to_string(&raw))
        .map_err(nvrtc_err("nvrtcGetPTX"))?;
    let mut size = 0usize;
    // SAFETY: a live, compiled program and a valid out-pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(nvrtc_err("nvrtcGetCUBINSize"))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the `size` bytes NVRTC just asked for. Without a real
    // architecture in the options the size is 0 and the image is empty, refused below.
    unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast()) }
        .result()
        .map_err(nvrtc_err("nvrtcGetCUBIN"))?;
    if cubin.is_empty() {
        return Err(KernelError::Nvrtc {
            call: "nvrtcGetCUBIN",
            code: "no SASS (compiled for a virtual architecture)".into(),
        });
    }
    Ok(Output { ptx, cubin, log })
}

/// NVRTC returns NUL-terminated buffers; keep the text before the first NUL.
fn c_chars_to_string(raw: &[c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        // `c_char` is `i8` on x86-64 and `u8` on AArch64: the same bits either way.
        .map(|&c| c.to_ne_bytes()[0])
        .take_while(|&b| b != 0)
        .collect();
    String::from_utf8_lossy(&bytes).trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_buffers_stop_at_the_first_nul_and_drop_trailing_space() {
        let raw: Vec<c_char> = b"warning: x\n\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_chars_to_string(&raw), "warning: x");
        assert_eq!(c_chars_to_string(&[0]), "");
    }

    #[test]
    fn builtins_are_found_beside_the_library_but_not_alt_variants() {
        let dir = std::env::temp_dir().join(format!("sparkd-nvrtc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "libnvrtc.so.13",
            "libnvrtc-builtins.so.13.0",
            "libnvrtc-builtins.alt.so.13.0",
            "other.so",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        let found = builtins_beside(&dir.join("libnvrtc.so.13"));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, vec![dir.join("libnvrtc-builtins.so.13.0")]);
    }

    #[test]
    fn a_missing_explicit_library_is_an_error_not_a_panic() {
        let err = preload(Path::new("/nonexistent/libnvrtc.so.13")).unwrap_err();
        assert!(matches!(err, KernelError::NvrtcLoad { .. }), "{err}");
    }
}
