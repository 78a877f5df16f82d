//! The stand-in driver's (emu/fake_libcuda.cpp) rules for modules and launches, called
//! directly: the end-to-end tests reach it only through a well-behaved sparkd, so they
//! cannot show that it refuses what a GPU refuses. It must load SASS for the device's
//! architecture only, and fail a launch whose block needs more registers than an SM
//! gives one, as a GPU does ("too many resources requested for launch").
//!
//! Needs NVRTC (for the cubins) and a C++ compiler; without them the test says so and
//! passes, unless SPARKD_REQUIRE_NVRTC=1.

use std::ffi::{c_char, c_void, CString};

use libloading::Library;
use object::read::elf::ElfFile64;
use object::{Endianness, Object, ObjectSection};
use sparkd_kernels::{emu, load_nvrtc, Arch, Compiler};

const SUCCESS: i32 = 0;
const INVALID_VALUE: i32 = 1;
const INVALID_IMAGE: i32 = 200;
const NO_BINARY_FOR_GPU: i32 = 209;
const LAUNCH_OUT_OF_RESOURCES: i32 = 701;

/// The driver calls this test makes, resolved from the stand-in library.
struct Driver {
    lib: Library,
}

impl Driver {
    fn call<F: Copy>(&self, name: &str) -> F {
        // SAFETY: each caller names the function type of the driver API call it uses.
        unsafe { *self.lib.get::<F>(name.as_bytes()).unwrap() }
    }

    fn load(&self, image: &[u8]) -> (i32, *mut c_void) {
        let mut module = std::ptr::null_mut();
        let f: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> i32 =
            self.call("cuModuleLoadData");
        // SAFETY: a valid out-pointer; the image outlives the call.
        (unsafe { f(&mut module, image.as_ptr().cast()) }, module)
    }

    fn function(&self, module: *mut c_void, name: &str) -> *mut c_void {
        let mut func = std::ptr::null_mut();
        let f: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> i32 =
            self.call("cuModuleGetFunction");
        let name = CString::new(name).unwrap();
        // SAFETY: a module this driver returned, a NUL-terminated name.
        assert_eq!(unsafe { f(&mut func, module, name.as_ptr()) }, SUCCESS);
        func
    }

    fn alloc(&self, bytes: usize) -> u64 {
        let mut p = 0u64;
        let f: unsafe extern "C" fn(*mut u64, usize) -> i32 = self.call("cuMemAlloc_v2");
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { f(&mut p, bytes) }, SUCCESS);
        p
    }

    /// rmsnorm_f32 over one row of `n` floats with `threads` threads.
    fn launch_rmsnorm(&self, func: *mut c_void, threads: u32, n: i32) -> i32 {
        let (x, w, out) = (
            self.alloc(4 * n as usize),
            self.alloc(4 * n as usize),
            self.alloc(4 * n as usize),
        );
        let eps = 1e-5f32;
        let mut args: [*mut c_void; 5] = [
            &x as *const u64 as *mut c_void,
            &w as *const u64 as *mut c_void,
            &out as *const u64 as *mut c_void,
            &n as *const i32 as *mut c_void,
            &eps as *const f32 as *mut c_void,
        ];
        type Launch = unsafe extern "C" fn(
            *mut c_void,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            u32,
            *mut c_void,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> i32;
        let f: Launch = self.call("cuLaunchKernel");
        // SAFETY: the arguments point at live locals of the kernel's parameter types.
        let rc = unsafe {
            f(
                func,
                1,
                1,
                1,
                threads,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        let sync: unsafe extern "C" fn() -> i32 = self.call("cuCtxSynchronize");
        // SAFETY: no arguments.
        assert_eq!(unsafe { sync() }, SUCCESS);
        rc
    }
}

/// The stand-in, initialised with a current context on this thread, or `None` to skip.
fn driver() -> Option<Driver> {
    let setup = || -> Result<Driver, String> {
        load_nvrtc().map_err(|e| format!("NVRTC: {e}"))?;
        let dir = emu::fake_driver_dir().map_err(|e| e.to_string())?;
        // SAFETY: the stand-in's initialisers only set up its own state.
        let lib = unsafe { Library::new(dir.join("libcuda.so")) }.map_err(|e| e.to_string())?;
        Ok(Driver { lib })
    };
    let d = emu::setup_or_skip(
        setup(),
        "the stand-in CUDA driver needs NVRTC and a C++ compiler",
    )?;
    let init: unsafe extern "C" fn(u32) -> i32 = d.call("cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, i32) -> i32 =
        d.call("cuDevicePrimaryCtxRetain");
    let set: unsafe extern "C" fn(*mut c_void) -> i32 = d.call("cuCtxSetCurrent");
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the driver API's start-up sequence, with valid out-pointers.
    unsafe {
        assert_eq!(init(0), SUCCESS);
        assert_eq!(retain(&mut ctx, 0), SUCCESS);
        assert_eq!(set(ctx), SUCCESS);
    }
    Some(d)
}

/// `cubin` with every kernel's register count (EIATTR_REGCOUNT in `.nv.info`) set to
/// `regs`, as ptxas would write it for a register-hungry kernel.
fn with_register_count(cubin: &[u8], regs: u32) -> Vec<u8> {
    let file = ElfFile64::<Endianness>::parse(cubin).unwrap();
    let info = file.section_by_name(".nv.info").expect(".nv.info");
    let (start, size) = info.file_range().unwrap();
    let mut out = cubin.to_vec();
    let (mut p, end) = (start as usize, (start + size) as usize);
    let mut patched = 0;
    while p + 4 <= end {
        let (format, attr) = (out[p], out[p + 1]);
        let len = u16::from_le_bytes([out[p + 2], out[p + 3]]) as usize;
        // Format 4 records carry `len` bytes; the others fit in their 4-byte header.
        let payload = if format == 4 { len } else { 0 };
        if attr == 0x2f && payload == 8 {
            out[p + 8..p + 12].copy_from_slice(&regs.to_le_bytes());
            patched += 1;
        }
        p += 4 + payload;
    }
    assert!(patched > 0, "no EIATTR_REGCOUNT records");
    out
}

#[test]
fn the_stand_in_loads_sass_for_its_device_only_and_refuses_launches_past_the_register_file() {
    let Some(d) = driver() else { return };
    // The stand-in's default device has compute capability 9.0.
    let compiler = Compiler::new().without_cache();
    let sm90: Arch = "sm_90".parse().unwrap();
    let hopper = compiler.compile_module("rmsnorm.cu", sm90).unwrap();
    let gb10 = compiler
        .compile_module("rmsnorm.cu", "sm_121".parse().unwrap())
        .unwrap();

    assert_eq!(d.load(gb10.image.cubin()).0, NO_BINARY_FOR_GPU);
    let ptx = CString::new(hopper.ptx.clone().unwrap()).unwrap();
    assert_eq!(
        d.load(ptx.as_bytes_with_nul()).0,
        INVALID_IMAGE,
        "PTX is refused"
    );

    let (rc, module) = d.load(hopper.image.cubin());
    assert_eq!(rc, SUCCESS);
    let func = d.function(module, "rmsnorm_f32");
    assert_eq!(d.launch_rmsnorm(func, 1024, 4096), SUCCESS);
    assert_eq!(
        d.launch_rmsnorm(func, 1056, 4096),
        INVALID_VALUE,
        "past 1024 threads"
    );

    // At 255 registers a thread, a warp takes 8 Ki of the block's 64 Ki registers:
    // eight warps launch, nine do not.
    let (rc, hungry) = d.load(&with_register_count(hopper.image.cubin(), 255));
    assert_eq!(rc, SUCCESS);
    let func = d.function(hungry, "rmsnorm_f32");
    assert_eq!(d.launch_rmsnorm(func, 256, 4096), SUCCESS);
    assert_eq!(d.launch_rmsnorm(func, 288, 4096), LAUNCH_OUT_OF_RESOURCES);
}

/// Copies into page-locked memory (cuMemHostAlloc, where sparkd's logit rows land) are
/// queued like kernels: the data is there only once the stream is waited for. Into
/// pageable memory the call itself waits. A GPU behaves so, and a download that forgot
/// to wait would read stale rows on one.
#[test]
fn copies_into_page_locked_memory_land_when_the_stream_is_waited_for() {
    let Some(d) = driver() else { return };
    type Ptr = *mut c_void;
    let create: unsafe extern "C" fn(*mut Ptr, u32) -> i32 = d.call("cuStreamCreate");
    let memset: unsafe extern "C" fn(u64, u8, usize, Ptr) -> i32 = d.call("cuMemsetD8Async");
    let host_alloc: unsafe extern "C" fn(*mut Ptr, usize, u32) -> i32 = d.call("cuMemHostAlloc");
    let free_host: unsafe extern "C" fn(Ptr) -> i32 = d.call("cuMemFreeHost");
    let dtoh: unsafe extern "C" fn(Ptr, u64, usize, Ptr) -> i32 = d.call("cuMemcpyDtoHAsync_v2");
    let sync: unsafe extern "C" fn(Ptr) -> i32 = d.call("cuStreamSynchronize");
    const N: usize = 4096;
    let dev = d.alloc(N);
    let (mut stream, mut pinned) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers; `pinned` holds N bytes once allocated, `pageable` is a
    // live local of N bytes, and `dev` a device allocation of N bytes.
    unsafe {
        assert_eq!(create(&mut stream, 0), SUCCESS);
        assert_eq!(host_alloc(&mut pinned, N, 0), SUCCESS);
        assert_eq!(host_alloc(&mut pinned, 0, 0), INVALID_VALUE, "0 bytes");
        let host = std::slice::from_raw_parts_mut(pinned.cast::<u8>(), N);
        host.fill(1);

        assert_eq!(memset(dev, 7, N, stream), SUCCESS);
        assert_eq!(dtoh(pinned, dev, N, stream), SUCCESS);
        assert!(host.iter().all(|&b| b == 1), "landed before the stream ran");
        assert_eq!(sync(stream), SUCCESS);
        assert!(host.iter().all(|&b| b == 7), "landed once waited for");

        let mut pageable = vec![0u8; N];
        assert_eq!(memset(dev, 9, N, stream), SUCCESS);
        assert_eq!(dtoh(pageable.as_mut_ptr().cast(), dev, N, stream), SUCCESS);
        assert!(pageable.iter().all(|&b| b == 9), "pageable: the call waits");

        assert_eq!(free_host(pageable.as_mut_ptr().cast()), INVALID_VALUE);
        assert_eq!(free_host(pinned), SUCCESS);
    }
}
