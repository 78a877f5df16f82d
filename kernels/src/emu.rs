//! Runs kernels on the CPU through `kernels/emu/` (a C++20 emulation of the CUDA features
//! the sources use), so tests check the real kernel code on machines without a GPU.
//! Needs a C++ compiler (`$CXX`, else `c++`); the runner is built once per source hash
//! into the temporary directory. Test support, and slow.
//!
//! `SPARKD_EMU_CHECK` builds the runner with a sanitizer, and every launch is also a
//! check (see `emu/cuda_emu.h`): `races` (ThreadSanitizer) for races between the
//! threads of a block, `memory` (AddressSanitizer and UBSan's alignment check) for
//! accesses past a buffer or a shared array and loads at misaligned addresses. A
//! finding fails the launch with the sanitizer's report and stacks.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use sha2::{Digest, Sha256};

use crate::sources::{HEADERS, SOURCES};
use crate::unique_suffix;

const EMU_FILES: &[(&str, &str)] = &[
    ("emu/cuda_emu.h", include_str!("../emu/cuda_emu.h")),
    ("emu/kernels.h", include_str!("../emu/kernels.h")),
    ("emu/selftest.cu", include_str!("../emu/selftest.cu")),
    ("emu/runner.cpp", include_str!("../emu/runner.cpp")),
    (
        "emu/fake_libcuda.cpp",
        include_str!("../emu/fake_libcuda.cpp"),
    ),
];

/// The flags both builds share: C++20, and floating point exactly as written (no
/// contraction into FMAs), so results are reproducible across hosts.
const CXX_FLAGS: &[&str] = &[
    "-std=c++20",
    "-O1",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-pthread",
    "-Wno-unknown-pragmas",
];

#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    #[error("no C++ compiler ({0}): set CXX or install g++")]
    NoCompiler(String),
    #[error("building the emulator failed:\n{0}")]
    Build(String),
    #[error("emulator I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("{kernel} failed in the emulator: {stderr}")]
    Launch { kernel: String, stderr: String },
}

/// One kernel argument, in parameter order.
#[derive(Debug)]
pub enum Arg<'a> {
    /// A device buffer: copied in before the launch and back out after it.
    Buf(&'a mut [u8]),
    /// A device buffer passed as a pointer this many bytes into it.
    BufAt(&'a mut [u8], usize),
    /// A pointer `offset` bytes into the buffer of argument `arg` (an earlier `Buf` or
    /// `BufAt`): two parameters aliasing one allocation, as in-place kernels and
    /// sub-buffers do on the device. Copying each argument separately would silently
    /// give the kernel two independent copies instead.
    View {
        arg: usize,
        offset: usize,
    },
    Null,
    I32(i32),
    I64(i64),
    F32(f32),
}

/// The built runner.
#[derive(Debug)]
pub struct Emulator {
    exe: PathBuf,
    check: Check,
}

/// What a runner checks besides the results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing: the fast runner.
    None,
    /// Races between the threads of a block (ThreadSanitizer); blocks run last to first.
    Races,
    /// Accesses outside a buffer or a shared array (AddressSanitizer), and loads or
    /// stores at addresses their type's alignment forbids (UBSan).
    Memory,
}

impl Check {
    /// From [`CHECK_ENV`]: unset or empty is [`Check::None`].
    pub fn from_env() -> Result<Check, EmuError> {
        match std::env::var(CHECK_ENV).unwrap_or_default().as_str() {
            "" => Ok(Check::None),
            "races" => Ok(Check::Races),
            "memory" => Ok(Check::Memory),
            other => Err(EmuError::Build(format!(
                "{CHECK_ENV}={other}: expected races or memory"
            ))),
        }
    }

    fn runner(self) -> RunnerBuild {
        match self {
            Check::None => RunnerBuild {
                file: "runner",
                flags: &[],
                env: &[],
            },
            // Stop at the first race and fail the launch; no pause at exit (TSan waits
            // a second by default for other threads to finish).
            Check::Races => RunnerBuild {
                file: "runner-races",
                flags: &["-fsanitize=thread", "-g"],
                env: &[(
                    "TSAN_OPTIONS",
                    "halt_on_error=1:exitcode=66:history_size=4:atexit_sleep_ms=0",
                )],
            },
            // With UBSan's alignment check: a load through a pointer the type does not
            // fit (a float4 at an address that is not 16-byte aligned) is the GPU's
            // "misaligned address". The fibers' stacks are the emulator's own mmaps: no
            // leak check.
            Check::Memory => RunnerBuild {
                file: "runner-memory",
                flags: &[
                    "-fsanitize=address,alignment",
                    "-fno-sanitize-recover=alignment",
                    "-fno-omit-frame-pointer",
                    "-g",
                ],
                env: &[
                    ("ASAN_OPTIONS", "detect_leaks=0:exitcode=66"),
                    ("UBSAN_OPTIONS", "print_stacktrace=1"),
                ],
            },
        }
    }
}

/// How the runner for a [`Check`] is built and run.
struct RunnerBuild {
    file: &'static str,
    flags: &'static [&'static str],
    /// The sanitizers' options: variables and values.
    env: &'static [(&'static str, &'static str)],
}

static EMULATOR: OnceLock<Result<Emulator, KeptFailure>> = OnceLock::new();

/// `races` or `memory`: run every emulated launch under that check.
pub const CHECK_ENV: &str = "SPARKD_EMU_CHECK";

impl Emulator {
    /// The process-wide emulator, built on first use, with the check [`CHECK_ENV`]
    /// asks for. A failure is reported again (as text) on later calls without
    /// rebuilding.
    pub fn get() -> Result<&'static Emulator, EmuError> {
        EMULATOR
            .get_or_init(|| Check::from_env().and_then(Self::build).map_err(kept))
            .as_ref()
            .map_err(retyped)
    }

    /// A runner of its own with `check`, whatever the environment says (the checks'
    /// own tests).
    pub fn build(check: Check) -> Result<Emulator, EmuError> {
        let runner = check.runner();
        let exe = build_once("emu/runner.cpp", runner.file, runner.flags)?;
        Ok(Emulator { exe, check })
    }

    /// What launches are checked for.
    pub fn check(&self) -> Check {
        self.check
    }

    /// Runs `kernel` over `grid` blocks of `block` threads with `args`.
    pub fn launch(
        &self,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &mut [Arg<'_>],
    ) -> Result<(), EmuError> {
        let dir = std::env::temp_dir().join(format!("sparkd-emu-job-{}", unique_suffix()));
        std::fs::create_dir_all(&dir)?;
        let result = self.run_job(&dir, kernel, grid, block, args);
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    fn run_job(
        &self,
        dir: &Path,
        kernel: &str,
        grid: [u32; 3],
        block: [u32; 3],
        args: &mut [Arg<'_>],
    ) -> Result<(), EmuError> {
        let mut job = format!(
            "kernel {kernel}\ngrid {} {} {}\nblock {} {} {}\n",
            grid[0], grid[1], grid[2], block[0], block[1], block[2]
        );
        for (i, a) in args.iter().enumerate() {
            match a {
                Arg::Buf(b) | Arg::BufAt(b, _) => {
                    let offset = match a {
                        Arg::BufAt(_, o) => *o,
                        _ => 0,
                    };
                    let p = dir.join(format!("buf{i}"));
                    std::fs::write(&p, &**b)?;
                    job.push_str(&format!("buf {} {offset}\n", p.display()));
                }
                Arg::View { arg, offset } => job.push_str(&format!("view {arg} {offset}\n")),
                Arg::Null => job.push_str("null\n"),
                Arg::I32(v) => job.push_str(&format!("i32 {v}\n")),
                Arg::I64(v) => job.push_str(&format!("i64 {v}\n")),
                Arg::F32(v) => job.push_str(&format!("f32 {}\n", v.to_bits())),
            }
        }
        let job_path = dir.join("job");
        std::fs::write(&job_path, job)?;
        let mut command = Command::new(&self.exe);
        command.arg(&job_path);
        command.envs(self.check.runner().env.iter().copied());
        let out = command.output()?;
        if !out.status.success() {
            return Err(EmuError::Launch {
                kernel: kernel.to_string(),
                stderr: format!(
                    "{} {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        for (i, a) in args.iter_mut().enumerate() {
            if let Arg::Buf(b) | Arg::BufAt(b, _) = a {
                let data = std::fs::read(dir.join(format!("buf{i}")))?;
                if data.len() != b.len() {
                    return Err(EmuError::Launch {
                        kernel: kernel.to_string(),
                        stderr: format!("buffer {i} came back with {} bytes", data.len()),
                    });
                }
                b.copy_from_slice(&data);
            }
        }
        Ok(())
    }
}

static FAKE_DRIVER: OnceLock<Result<PathBuf, KeptFailure>> = OnceLock::new();

/// Set in CI: a test that needs NVRTC or the stand-in driver fails when they are missing,
/// instead of passing with a `SKIPPED` line.
pub const REQUIRE_NVRTC_ENV: &str = "SPARKD_REQUIRE_NVRTC";

/// For a test whose `setup` needs NVRTC (and, for the stand-in driver, a C++ compiler):
/// the value, or `None` after saying why the test is skipped, or a panic under
/// `SPARKD_REQUIRE_NVRTC=1`. `needs` completes "SKIPPED: ...".
pub fn setup_or_skip<T>(setup: Result<T, String>, needs: &str) -> Option<T> {
    match setup {
        Ok(v) => Some(v),
        Err(why) if std::env::var_os(REQUIRE_NVRTC_ENV).is_some_and(|v| v == "1") => {
            panic!("{REQUIRE_NVRTC_ENV}=1 but {needs}: {why}")
        }
        Err(why) => {
            eprintln!("SKIPPED: {needs}: {why}");
            None
        }
    }
}

/// Builds (once per process, and once per source hash on disk) the stand-in CUDA
/// driver, `emu/fake_libcuda.cpp`, and returns the directory holding it as
/// `libcuda.so`: a process started with that directory first on `LD_LIBRARY_PATH`
/// runs its CUDA backend on the emulator. Tests use it to run the driver-facing code
/// (device probe, module loading, launches, graphs, events) without a GPU.
pub fn fake_driver_dir() -> Result<PathBuf, EmuError> {
    let built = FAKE_DRIVER.get_or_init(|| {
        build_once(
            "emu/fake_libcuda.cpp",
            "libcuda.so",
            &["-fPIC", "-shared", "-fvisibility=hidden"],
        )
        .map_err(kept)
    });
    match built {
        Ok(lib) => Ok(lib.parent().expect("built into a directory").to_path_buf()),
        Err(failure) => Err(retyped(failure)),
    }
}

/// A build failure as kept for later callers in the process (the error itself is not
/// `Clone`): whether the compiler was missing, and the detail.
type KeptFailure = (bool, String);

fn kept(e: EmuError) -> KeptFailure {
    match e {
        EmuError::NoCompiler(m) => (true, m),
        EmuError::Build(m) => (false, m),
        other => (false, other.to_string()),
    }
}

fn retyped((no_compiler, detail): &KeptFailure) -> EmuError {
    if *no_compiler {
        EmuError::NoCompiler(detail.clone())
    } else {
        EmuError::Build(detail.clone())
    }
}

/// Compiles `source` (a `.cpp` in EMU_FILES) with the kernel sources into `output`, in a
/// temporary directory named by the hash of its inputs and the compiler, and returns
/// the output's path. An existing output is reused; a new one appears atomically, so
/// concurrent test processes never run a half-written file.
fn build_once(source: &str, output: &str, extra: &[&str]) -> Result<PathBuf, EmuError> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
    // The kernels, the emulator's headers and this one program: editing the other
    // program does not rebuild this one.
    let inputs: Vec<&(&str, &str)> = SOURCES
        .iter()
        .chain(HEADERS)
        .chain(EMU_FILES)
        .filter(|(name, _)| match *name {
            // The self-test kernels are the job runner's alone.
            "emu/selftest.cu" => source == "emu/runner.cpp",
            name => !name.ends_with(".cpp") || name == source,
        })
        .collect();
    let mut h = Sha256::new();
    for (name, text) in &inputs {
        h.update(name.as_bytes());
        h.update(text.as_bytes());
    }
    h.update(cxx.as_bytes());
    for flag in extra {
        h.update(flag.as_bytes());
    }
    let hash: String = h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let dir = std::env::temp_dir().join(format!("sparkd-emu-{hash}"));
    let out_path = dir.join(output);
    if out_path.is_file() {
        return Ok(out_path);
    }
    std::fs::create_dir_all(dir.join("emu"))?;
    // Each source through a temporary file and a rename: another thread or process
    // building from this directory never compiles a half-written file.
    for (name, text) in &inputs {
        let path = dir.join(name);
        let tmp = path.with_extension(format!("{}.tmp", unique_suffix()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)?;
    }
    let tmp = dir.join(format!("{output}.{}.tmp", unique_suffix()));
    let out = Command::new(&cxx)
        .args(CXX_FLAGS)
        .args(extra)
        .arg("-o")
        .arg(&tmp)
        .arg(dir.join(source))
        .output()
        .map_err(|e| EmuError::NoCompiler(format!("{cxx}: {e}")))?;
    if !out.status.success() {
        return Err(EmuError::Build(
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ));
    }
    std::fs::rename(&tmp, &out_path)?;
    Ok(out_path)
}
