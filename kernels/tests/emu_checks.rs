//! The emulator's own checks, on kernels written to break them (`emu/selftest.cu`):
//! the race checker (the runner under ThreadSanitizer, `SPARKD_EMU_CHECK=races`) must
//! report every unordered shared-memory access, pass the same kernels with their
//! barriers, and run blocks in the other order; the memory checker (AddressSanitizer,
//! `SPARKD_EMU_CHECK=memory`) must report reads past a buffer or a shared array, and
//! (with UBSan) loads at misaligned addresses; every build must stop divergent or
//! partial-warp shuffles and mma and misaligned cp.async; and cp.async data must land
//! only when waited for. Skips without a C++ compiler, or without a sanitizer unless
//! `SPARKD_REQUIRE_EMU_CHECKS=1` (CI).

mod common;

use common::*;
use sparkd_kernels::emu::{Arg, Check, EmuError, Emulator};

const BLOCKS: u32 = 3;
const THREADS: usize = 64 * BLOCKS as usize;

fn plain() -> Option<Emulator> {
    match Emulator::build(Check::None) {
        Ok(e) => Some(e),
        Err(e @ EmuError::NoCompiler(_)) => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn race_checker() -> Option<Emulator> {
    checker(Check::Races)
}

fn memory_checker() -> Option<Emulator> {
    checker(Check::Memory)
}

fn checker(check: Check) -> Option<Emulator> {
    let required = std::env::var("SPARKD_REQUIRE_EMU_CHECKS").is_ok_and(|v| v == "1");
    match Emulator::build(check) {
        Ok(e) => Some(e),
        Err(e) if !required => {
            eprintln!("skipping: no {check:?} build of the emulator (its sanitizer?): {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// Runs a self-test kernel over `BLOCKS` blocks of 64, with `input` first when given.
/// Returns `out` (one float a thread).
fn run(emu: &Emulator, kernel: &str, input: Option<&[f32]>) -> Result<Vec<f32>, EmuError> {
    let mut out = f32_bytes(&vec![-1.0; THREADS]);
    let mut inb = input.map(f32_bytes).unwrap_or_default();
    let mut args = Vec::new();
    if input.is_some() {
        args.push(Arg::Buf(&mut inb));
    }
    args.push(Arg::Buf(&mut out));
    emu.launch(kernel, [BLOCKS, 1, 1], [64, 1, 1], &mut args)?;
    Ok(bytes_f32(&out))
}

/// Asserts that `kernel` fails the launch with a report naming `finding` and the kernel.
fn assert_reported(emu: &Emulator, kernel: &str, input: Option<&[f32]>, finding: &str) {
    match run(emu, kernel, input) {
        Err(EmuError::Launch { stderr, .. }) => assert!(
            stderr.contains(finding) && stderr.contains(kernel),
            "{kernel}: no {finding} reported in it:\n{stderr}"
        ),
        other => panic!(
            "{kernel}: went unreported under {:?}: {other:?}",
            emu.check()
        ),
    }
}

/// Each thread's input: 4 floats, the first being its global index.
fn input() -> Vec<f32> {
    (0..THREADS * 4)
        .map(|i| if i % 4 == 0 { (i / 4) as f32 } else { 0.5 })
        .collect()
}

/// What a kernel that reads its right-hand neighbour's value (within its block) wrote.
fn neighbours() -> Vec<f32> {
    (0..THREADS)
        .map(|g| (g / 64 * 64 + (g % 64 + 1) % 64) as f32)
        .collect()
}

#[test]
fn the_race_checker_reports_every_unordered_shared_memory_access() {
    let Some(emu) = race_checker() else { return };
    for kernel in [
        "selftest_shared_unsynced",
        "selftest_shared_after_shuffle",
        "selftest_shared_write_after_read",
    ] {
        assert_reported(&emu, kernel, None, "ThreadSanitizer: data race");
    }
}

#[test]
fn the_race_checker_passes_the_same_kernels_with_their_barriers() {
    let Some(emu) = race_checker() else { return };
    assert_eq!(emu.check(), Check::Races);
    let out = run(&emu, "selftest_shared_synced", None).unwrap();
    assert_eq!(out, neighbours());
    let out = run(&emu, "selftest_cp_async_waited", Some(&input())).unwrap();
    assert_eq!(out, neighbours());
}

#[test]
fn cp_async_data_lands_only_when_waited_for() {
    for emu in [plain(), race_checker(), memory_checker()]
        .into_iter()
        .flatten()
    {
        let waited = run(&emu, "selftest_cp_async_waited", Some(&input())).unwrap();
        assert_eq!(waited, neighbours(), "{:?}", emu.check());
        let unwaited = run(&emu, "selftest_cp_async_unwaited", Some(&input())).unwrap();
        assert_eq!(
            unwaited,
            vec![0.0; THREADS],
            "{:?}: an unwaited copy was read",
            emu.check()
        );
    }
}

#[test]
fn the_race_checker_runs_blocks_in_the_other_order() {
    // Block b adds one to what block b - 1 wrote: right only in launch order.
    let in_order: Vec<f32> = (0..THREADS).map(|g| (g % 64 + g / 64) as f32).collect();
    if let Some(emu) = plain() {
        assert_eq!(
            run(&emu, "selftest_blocks_chained", None).unwrap(),
            in_order
        );
    }
    if let Some(emu) = race_checker() {
        let out = run(&emu, "selftest_blocks_chained", None).unwrap();
        assert_ne!(out, in_order, "a dependence between blocks went unnoticed");
        // The last block ran first and read the untouched -1.
        assert_eq!(out[THREADS - 64..], vec![0.0; 64][..]);
    }
}

#[test]
fn the_memory_checker_reports_reads_past_a_buffer_or_a_shared_array() {
    let Some(emu) = memory_checker() else { return };
    let one_each: Vec<f32> = (0..THREADS).map(|g| g as f32).collect();
    assert_reported(
        &emu,
        "selftest_global_past_end",
        Some(&one_each),
        "AddressSanitizer: heap-buffer-overflow",
    );
    assert_reported(
        &emu,
        "selftest_shared_past_end",
        None,
        "AddressSanitizer: global-buffer-overflow",
    );
    assert_reported(
        &emu,
        "selftest_prefetch_past_end",
        Some(&one_each),
        "AddressSanitizer: heap-buffer-overflow",
    );
    let padded: Vec<f32> = (0..THREADS + 3).map(|g| g as f32).collect();
    assert_reported(
        &emu,
        "selftest_misaligned_vector_load",
        Some(&padded),
        "misaligned address",
    );
}

#[test]
fn the_memory_checker_passes_kernels_that_stay_in_bounds() {
    let Some(emu) = memory_checker() else { return };
    assert_eq!(
        run(&emu, "selftest_shared_synced", None).unwrap(),
        neighbours()
    );
    assert_eq!(
        run(&emu, "selftest_cp_async_waited", Some(&input())).unwrap(),
        neighbours()
    );
    let one_each: Vec<f32> = (0..THREADS).map(|g| g as f32).collect();
    assert_eq!(
        run(&emu, "selftest_prefetch_in_bounds", Some(&one_each)).unwrap(),
        one_each
    );
}

#[test]
fn every_emulator_stops_partial_warp_intrinsics_and_misaligned_copies() {
    let builds = [plain(), race_checker(), memory_checker()];
    for emu in builds.into_iter().flatten() {
        for (kernel, finding) in [
            (
                "selftest_shuffle_divergent",
                "lanes of one warp met at different warp exchanges",
            ),
            (
                "selftest_shuffle_from_exited",
                "reads lane 16, which does not take part",
            ),
            (
                "selftest_mma_partial_warp",
                "a warp-wide matrix instruction at",
            ),
        ] {
            assert_reported(&emu, kernel, None, finding);
        }
        assert_reported(
            &emu,
            "selftest_cp_async_misaligned",
            Some(&input()),
            "cp.async of 16 bytes with a source or destination not 16-byte aligned",
        );
        let across: Vec<f32> = (0..THREADS).map(|g| ((g % 64) ^ 1) as f32).collect();
        assert_eq!(
            run(&emu, "selftest_shuffle_uniform", None).unwrap(),
            across,
            "{:?}",
            emu.check()
        );
    }
}
