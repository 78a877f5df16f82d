//! Compiles every kernel module with NVRTC to SASS for Hopper (sm_90) and GB10 (sm_121)
//! and fails on any error or diagnostic (NVRTC's or ptxas's), then checks that each cubin
//! defines exactly the kernels `names::all()` lists, without spills or local memory. Needs libnvrtc.so.13: set SPARKD_NVRTC_LIB (see
//! scripts/install-cuda-wheels.sh, or run scripts/test-cuda-compile.sh) or put it on
//! LD_LIBRARY_PATH. Without it the tests say so and pass, unless SPARKD_REQUIRE_NVRTC=1.

use std::collections::BTreeSet;

use sparkd_kernels::{
    emu, load_nvrtc, names, units, Arch, Compiler, KernelCache, KernelError, Unit, SOURCES,
};

const ARCHES: [&str; 2] = ["sm_90", "sm_121"];

/// Whether NVRTC is usable; prints why not. An explicitly configured library that does
/// not load is a failure, not a skip.
fn nvrtc_or_skip() -> bool {
    match load_nvrtc() {
        Ok(v) => {
            eprintln!("NVRTC {v}");
            true
        }
        Err(e @ KernelError::NvrtcNotFound { .. }) => emu::setup_or_skip::<()>(
            Err(e.to_string()),
            "NVRTC not found (run scripts/install-cuda-wheels.sh)",
        )
        .is_some(),
        Err(e) => panic!("NVRTC is configured but unusable: {e}"),
    }
}

/// ptxas's `-v` report is the log's only content: anything else is a diagnostic.
fn is_resource_report(line: &str) -> bool {
    line.starts_with("ptxas info") || line.starts_with("ptxas         .")
}

/// Every (arch, module) pair compiled and checked, spread over the cores: one NVRTC
/// compile per pair, and a compile is single-threaded (serially this test took ~160 s of
/// a CI run on 2 cores).
#[test]
fn every_module_compiles_cleanly_for_hopper_and_gb10() {
    if !nvrtc_or_skip() {
        return;
    }
    let compiler = Compiler::new().without_cache();
    let expected = names::all();
    let jobs: Vec<(Arch, &str)> = ARCHES
        .iter()
        .flat_map(|arch| {
            SOURCES
                .iter()
                .map(move |(module, _)| (arch.parse().unwrap(), *module))
        })
        .collect();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<(usize, Vec<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers.min(jobs.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&(arch, module)) = jobs.get(i) else {
                            return done;
                        };
                        done.push((i, check_module(&compiler, &expected, arch, module)));
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("a compile thread"))
            .collect()
    });
    // Failures in a fixed order whatever thread found them.
    results.sort_by_key(|(i, _)| *i);
    let failures: Vec<String> = results.into_iter().flat_map(|(_, f)| f).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Compiles `module` for `arch` and checks it: no diagnostic, exactly the kernels
/// `names::all()` lists, no local memory, the PDL order, no spill or stack frame.
fn check_module(
    compiler: &Compiler,
    expected: &[(&str, String)],
    arch: Arch,
    module: &str,
) -> Vec<String> {
    let mut failures = Vec::new();
    let started = std::time::Instant::now();
    let compiled = match compiler.compile_reporting_resources(module, arch) {
        Ok(c) => c,
        Err(e) => return vec![format!("{e}")],
    };
    let report = &compiled.log;
    eprintln!(
        "{module} for {arch}: {} kernels, {} bytes of SASS, {:.1?}",
        compiled.image.entry_points().count(),
        compiled.image.cubin().len(),
        started.elapsed()
    );
    let diagnostics: Vec<&str> = report.lines().filter(|l| !is_resource_report(l)).collect();
    if !diagnostics.is_empty() {
        failures.push(format!(
            "{module} for {arch} has diagnostics:\n{}",
            diagnostics.join("\n")
        ));
    }
    let got: BTreeSet<&str> = compiled.image.entry_points().collect();
    let want: BTreeSet<&str> = expected
        .iter()
        .filter(|(m, _)| *m == module)
        .map(|(_, n)| n.as_str())
        .collect();
    if got != want {
        failures.push(format!(
            "{module} for {arch}: kernels missing {:?}, unlisted {:?}",
            want.difference(&got).collect::<Vec<_>>(),
            got.difference(&want).collect::<Vec<_>>()
        ));
    }
    // Register arrays that NVRTC could not keep in registers (dynamic indexing) become
    // local-memory frames, far slower than the design assumes. RoPE's only frame is
    // sincosf's argument reduction for angles past ~1e5 radians.
    let ptx = compiled.ptx.as_deref().unwrap_or_default();
    if ptx.contains(".local .align") && module != "rope_kv.cu" {
        failures.push(format!("{module} for {arch}: PTX uses local memory"));
    }
    failures.extend(
        pdl_order_failures(ptx)
            .into_iter()
            .map(|f| format!("{module} for {arch}: {f}")),
    );
    let frames = ptxas_frames(report);
    if frames.len() != want.len() {
        failures.push(format!(
            "{module} for {arch}: ptxas reported {} kernels, expected {}:\n{report}",
            frames.len(),
            want.len()
        ));
    }
    for (kernel, frame, spills) in frames {
        // As above: RoPE's frame is sincosf's slow path, not a spill.
        if spills > 0 || (frame > 0 && module != "rope_kv.cu") {
            failures.push(format!(
                "{kernel} for {arch}: {frame} bytes stack frame, {spills} bytes spilled"
            ));
        }
    }
    failures
}

#[test]
fn compiled_kernels_are_cached_and_reused() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sparkd-kernels-it-{}", std::process::id()));
    let compiler = Compiler::new().with_cache(KernelCache::new(&dir));
    let arch: Arch = "sm_121".parse().unwrap();
    let first = compiler.compile_module("rope_kv.cu", arch).unwrap();
    let second = compiler.compile_module("rope_kv.cu", arch).unwrap();
    let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    std::fs::remove_dir_all(&dir).ok();
    assert!(!first.from_cache);
    assert!(second.from_cache);
    assert_eq!(first.image, second.image);
    assert_eq!(files, 1);
}

/// What the daemon does at start-up: every unit (a worker per core), every
/// kernel the host launches defined, each module cached for the next start.
#[test]
fn compile_all_builds_every_module_concurrently_into_the_cache() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("sparkd-kernels-all-{}", std::process::id()));
    let compiler = Compiler::new().with_cache(KernelCache::new(&dir));
    let arch: Arch = "sm_90".parse().unwrap();
    let first = compiler.compile_all(arch).unwrap();
    let files = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0);
    let second = compiler.compile_all(arch).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let order: Vec<Unit> = first.modules.iter().map(|p| p.unit()).collect();
    assert_eq!(order, units(), "images in unit order");
    assert_eq!(files, units().len(), "one cache file per unit");
    for (module, kernel) in names::all() {
        let defined_by = first.module_of(&kernel).map(|p| p.module());
        assert_eq!(defined_by, Some(module), "{kernel}");
    }
    // A unit of one weight format holds that format's kernels and no others.
    let total: usize = first.modules.iter().map(|p| p.entry_points().count()).sum();
    assert_eq!(total, names::all().len(), "each kernel in one image");
    for image in &first.modules {
        if let Some(t) = image.unit().only {
            let tag = format!("_{}_", t.suffix());
            assert!(
                image.entry_points().all(|e| e.contains(&tag)),
                "{}: {:?}",
                image.unit().label(),
                image.entry_points().collect::<Vec<_>>()
            );
        }
    }
    assert_eq!(
        first.modules, second.modules,
        "the second start reads the cache"
    );
}

/// The kernels whose PTX breaks the rule programmatic dependent launch rests on
/// (common.cuh, `pdl_enter`): each entry waits (`griddepcontrol.wait`) exactly once and
/// lets the next grid launch, and no load or store but of its parameters comes before
/// the wait in the program text (an L2 prefetch of weights may). Sources call
/// `pdl_enter()` first, so this catches an entry point without it and a load moved in
/// front of it; a wait placed in a branch would need a control-flow analysis to catch.
fn pdl_order_failures(ptx: &str) -> Vec<String> {
    let mut failures = Vec::new();
    for entry in ptx.split(".entry ").skip(1) {
        let name: String = entry
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let mut waits = 0;
        let mut launches = false;
        let mut early = None;
        for line in entry.lines() {
            let line = line.split("//").next().unwrap_or("").trim();
            // `@%p1 ld.global...`, `@!%p2 st...`: the opcode follows the guard.
            let op = line
                .strip_prefix('@')
                .and_then(|l| l.split_once(char::is_whitespace))
                .map_or(line, |(_, rest)| rest.trim_start());
            if op.starts_with("griddepcontrol.wait") {
                waits += 1;
            } else if op.starts_with("griddepcontrol.launch_dependents") {
                launches = true;
            } else if waits == 0 && early.is_none() && touches_memory(op) {
                early = Some(op.to_string());
            }
        }
        if let Some(op) = early {
            failures.push(format!("{name}: `{op}` before griddepcontrol.wait"));
        }
        if waits != 1 {
            failures.push(format!("{name}: {waits} griddepcontrol.wait, expected 1"));
        }
        if !launches {
            failures.push(format!("{name}: no griddepcontrol.launch_dependents"));
        }
    }
    failures
}

/// A PTX instruction that reads or writes memory a kernel before this one may write,
/// or write what it reads (anything but kernel parameters and prefetch hints).
fn touches_memory(op: &str) -> bool {
    const OPS: [&str; 9] = [
        "ld.", "ldu.", "st.", "atom.", "red.", "cp.async", "ldmatrix", "tex.", "sured.",
    ];
    OPS.iter().any(|p| op.starts_with(p)) && !op.starts_with("ld.param")
}

#[test]
fn pdl_order_check_catches_a_load_before_the_wait_and_a_missing_wait() {
    let good = "
.visible .entry ok(
\t.param .u64 ok_param_0
)
{
\tld.param.u64 \t%rd1, [ok_param_0];
\tprefetch.global.L2 \t[%rd2];
\t// begin inline asm
\tgriddepcontrol.wait;
\t// end inline asm
\tgriddepcontrol.launch_dependents;
\tld.global.nc.f32 \t%f1, [%rd1];
}";
    assert!(
        pdl_order_failures(good).is_empty(),
        "{:?}",
        pdl_order_failures(good)
    );
    let early = good.replace(
        "\tprefetch.global.L2 \t[%rd2];",
        "\t@%p1 ld.global.f32 %f2, [%rd2];",
    );
    let failures = pdl_order_failures(&early);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].starts_with("ok: `ld.global.f32"),
        "{failures:?}"
    );
    let store = good.replace(
        "\tprefetch.global.L2 \t[%rd2];",
        "\tst.global.f32 [%rd2], %f2;",
    );
    assert_eq!(pdl_order_failures(&store).len(), 1);
    let missing = good
        .replace("\tgriddepcontrol.wait;", "")
        .replace("\tgriddepcontrol.launch_dependents;", "");
    let failures = pdl_order_failures(&missing);
    assert!(
        failures
            .iter()
            .any(|f| f == "ok: 0 griddepcontrol.wait, expected 1")
            && failures
                .iter()
                .any(|f| f == "ok: no griddepcontrol.launch_dependents"),
        "{failures:?}"
    );
    let twice = format!("{good}\n.visible .entry second(\n)\n{{\n\tret;\n}}");
    assert_eq!(
        pdl_order_failures(&twice),
        vec![
            "second: 0 griddepcontrol.wait, expected 1".to_string(),
            "second: no griddepcontrol.launch_dependents".to_string()
        ]
    );
}

/// The `(kernel, stack frame bytes, spill store bytes)` triples of a ptxas `-v` report.
fn ptxas_frames(report: &str) -> Vec<(String, u64, u64)> {
    let mut out = Vec::new();
    let mut kernel = String::new();
    for line in report.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            kernel = rest.split('\'').next().unwrap_or_default().to_string();
        } else if line.contains("bytes stack frame") {
            let nums: Vec<u64> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|t| t.parse().ok())
                .collect();
            if let [frame, spill_st, _spill_ld, ..] = nums[..] {
                out.push((kernel.clone(), frame, spill_st));
            }
        }
    }
    out
}
