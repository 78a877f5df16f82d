//! A fork-join pool of persistent worker threads for the model's parallel loops.
//!
//! A forward pass runs a few hundred short parallel operations (microseconds each), so a
//! dispatch must cost about a microsecond: workers spin for a while on a shared epoch
//! counter after each job, and only park on a condition variable when the pool has been
//! idle for longer than `SPIN_FOR`. The calling thread takes part as thread 0.
//!
//! Thread indices are claimed, not assigned: whichever thread is ready first runs the
//! next unclaimed index, and the caller runs any that are left when it is done with its
//! own. On a machine busier than it has cores a descheduled worker then costs at most
//! its share of the work, not a scheduler time slice of waiting.

use std::any::Any;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before it parks. Long enough to bridge the serial gaps
/// between the parallel operations of one forward pass, short enough not to burn a core
/// while the daemon waits for requests.
const SPIN_FOR: Duration = Duration::from_micros(200);

type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// What the caller and the workers share.
struct Shared {
    n_threads: usize,
    /// Bumped once per job to wake the workers.
    epoch: AtomicUsize,
    /// Points at the caller's `&Job` for the duration of one `run`.
    job: AtomicPtr<&'static Job<'static>>,
    /// The next thread index (1..n) to claim; reset to 1 by each `run`, and only ever
    /// incremented otherwise, so a claim below `n_threads` belongs to the current job.
    claim: AtomicUsize,
    /// Claimed indices (other than 0) whose call has returned.
    done: AtomicUsize,
    /// The first panic of the current job, re-raised on the caller.
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    shutdown: AtomicBool,
    /// Parking: workers wait here once they have spun for `SPIN_FOR`.
    sleepers: AtomicUsize,
    park: Mutex<()>,
    wake: Condvar,
}

/// Persistent worker threads; `run` executes a closure on all of them plus the caller.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    /// Serializes `run` calls from different threads.
    run_lock: Mutex<()>,
}

thread_local! {
    /// Set while this thread executes a pool job: a nested `run` then executes inline
    /// instead of deadlocking on the pool it is part of.
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all, the caller included (at least 1).
    pub fn new(n_threads: usize) -> Self {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            epoch: AtomicUsize::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            claim: AtomicUsize::new(usize::MAX / 2),
            done: AtomicUsize::new(0),
            panic: Mutex::new(None),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            park: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut workers = Vec::with_capacity(n_threads - 1);
        for index in 1..n_threads {
            let shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("sparkd-cpu-{index}"))
                .spawn(move || worker(&shared));
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(e) => {
                    // Indices are claimed, so fewer workers are still correct: the
                    // caller runs the indices nobody else takes.
                    tracing::warn!(
                        "could not start CPU worker thread {index}: {e}; running with {}",
                        workers.len() + 1
                    );
                    break;
                }
            }
        }
        Self {
            shared,
            workers,
            run_lock: Mutex::new(()),
        }
    }

    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Calls `f(i)` once for every `i` in `0..tasks`, spread over the pool's threads as
    /// they come free (tasks of uneven cost balance), and returns when all have returned.
    pub fn for_each_task(&self, tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if tasks <= 1 {
            (0..tasks).for_each(f);
            return;
        }
        let next = AtomicUsize::new(0);
        self.run(&|_, _| loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= tasks {
                break;
            }
            f(i);
        });
    }

    /// Calls `f(index, n_threads)` exactly once for every index in `0..n_threads`, in
    /// parallel, and returns when all calls have returned. The caller runs index 0 and
    /// any index no worker has claimed by then, so two indices may share a thread. A
    /// panic in any call is re-raised here after the others have finished. Called from
    /// inside a job, it runs all indices inline on the calling thread.
    pub fn run(&self, f: &(dyn Fn(usize, usize) + Sync)) {
        let n = self.shared.n_threads;
        if n == 1 || IN_JOB.with(Cell::get) {
            for i in 0..n {
                f(i, n);
            }
            return;
        }
        let _serial = lock(&self.run_lock);
        let shared = &*self.shared;

        // SAFETY: the `'static` is a lie that this function makes true: the job is only
        // dereferenced by a thread that claimed an index below `n` (possible only between
        // the `claim` reset below and the moment every index is claimed), and this
        // function does not return (or unwind) before every claimed call has returned.
        let f_static: &'static Job<'static> = unsafe { std::mem::transmute::<&Job<'_>, _>(f) };
        let job_ref: &&'static Job<'static> = &f_static;
        shared
            .job
            .store(job_ref as *const _ as *mut _, Ordering::Relaxed);
        shared.done.store(0, Ordering::Relaxed);
        // Publishes `job` and `done` to whoever claims an index.
        shared.claim.store(1, Ordering::Release);
        // SeqCst pairs with the sleeper count in `worker` (see there).
        shared.epoch.fetch_add(1, Ordering::SeqCst);
        if shared.sleepers.load(Ordering::SeqCst) > 0 {
            let _g = lock(&shared.park);
            shared.wake.notify_all();
        }

        let mine = run_marked(|| f(0, n));
        // Run the indices no worker has claimed yet.
        run_claimed(shared);

        let mut spins = 0u32;
        while shared.done.load(Ordering::Acquire) != n - 1 {
            spins = spins.wrapping_add(1);
            if spins < 1 << 12 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        shared.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        let theirs = lock(&shared.panic).take();
        if let Err(payload) = mine {
            panic::resume_unwind(payload);
        }
        if let Some(payload) = theirs {
            panic::resume_unwind(payload);
        }
    }
}

/// Claims and runs indices of the current job until none are left.
fn run_claimed(shared: &Shared) {
    let n = shared.n_threads;
    loop {
        let i = shared.claim.fetch_add(1, Ordering::Acquire);
        if i >= n {
            return;
        }
        // SAFETY: a claim below `n` means a `run` is in progress: it stored a pointer to
        // a live `&Job` before resetting `claim` (the Acquire above makes it visible) and
        // waits for this call to be counted in `done` before the job dies.
        let f: &Job<'static> = unsafe { *shared.job.load(Ordering::Relaxed) };
        if let Err(payload) = run_marked(|| f(i, n)) {
            lock(&shared.panic).get_or_insert(payload);
        }
        shared.done.fetch_add(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        self.shared.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _g = lock(&self.shared.park);
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.shared.n_threads)
            .finish()
    }
}

/// Locks a mutex whose data cannot be left inconsistent by a panic (`()` or an
/// `Option` that is only ever replaced whole).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` with `IN_JOB` set, catching a panic.
fn run_marked(f: impl FnOnce()) -> Result<(), Box<dyn Any + Send>> {
    IN_JOB.with(|c| c.set(true));
    let r = panic::catch_unwind(AssertUnwindSafe(f));
    IN_JOB.with(|c| c.set(false));
    r
}

fn worker(shared: &Shared) {
    let mut seen = 0usize;
    loop {
        // Wait for a new epoch: spin first, then park.
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let e = shared.epoch.load(Ordering::Acquire);
            if e != seen {
                seen = e;
                break;
            }
            spins = spins.wrapping_add(1);
            if spins % 256 != 0 || start.elapsed() < SPIN_FOR {
                std::hint::spin_loop();
                continue;
            }
            let mut g = lock(&shared.park);
            // Dekker-style pairing with `run`: either the caller sees `sleepers > 0`
            // and notifies under the lock, or this load sees its new epoch.
            shared.sleepers.fetch_add(1, Ordering::SeqCst);
            while shared.epoch.load(Ordering::SeqCst) == seen {
                g = shared.wake.wait(g).unwrap_or_else(|p| p.into_inner());
            }
            shared.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        if shared.shutdown.load(Ordering::Acquire) {
            return;
        }
        run_claimed(shared);
    }
}

/// Physical cores available to this process: the default thread count (hyper-threads
/// share the vector units the kernels saturate, so they do not help).
pub fn physical_cores() -> usize {
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    let physical = sysinfo::System::new()
        .physical_core_count()
        .unwrap_or(available);
    physical.clamp(1, available)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn every_thread_runs_once_per_call() {
        for n in [1, 2, 3, 5] {
            let pool = ThreadPool::new(n);
            assert_eq!(pool.n_threads(), n);
            for _ in 0..200 {
                let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
                pool.run(&|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn every_task_runs_exactly_once_whatever_the_count() {
        for n in [1, 3] {
            let pool = ThreadPool::new(n);
            for tasks in [0, 1, 2, 7, 64] {
                let hits: Vec<AtomicUsize> = (0..tasks).map(|_| AtomicUsize::new(0)).collect();
                pool.for_each_task(tasks, &|i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{n} threads, {tasks} tasks"
                );
            }
        }
    }

    #[test]
    fn results_are_visible_after_run() {
        let pool = ThreadPool::new(3);
        let mut data = vec![0u64; 3000];
        for round in 1..50u64 {
            let cells: Vec<AtomicU64> = data.iter().map(|&v| AtomicU64::new(v)).collect();
            pool.run(&|i, n| {
                for c in cells.iter().skip(i).step_by(n) {
                    c.fetch_add(round, Ordering::Relaxed);
                }
            });
            data = cells.into_iter().map(AtomicU64::into_inner).collect();
        }
        assert!(data.iter().all(|&v| v == (1..50).sum::<u64>()));
    }

    #[test]
    fn a_panic_reaches_the_caller_and_the_pool_survives() {
        let pool = ThreadPool::new(3);
        for victim in 0..3 {
            let r = panic::catch_unwind(AssertUnwindSafe(|| {
                pool.run(&|i, _| {
                    if i == victim {
                        panic!("boom in {i}");
                    }
                })
            }));
            let payload = r.expect_err("the panic must propagate");
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_default();
            assert_eq!(msg, format!("boom in {victim}"));
        }
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn parked_workers_wake_up() {
        let pool = ThreadPool::new(2);
        for _ in 0..3 {
            std::thread::sleep(SPIN_FOR * 5);
            let count = AtomicUsize::new(0);
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
            assert_eq!(count.load(Ordering::Relaxed), 2);
        }
    }

    #[test]
    fn nested_run_executes_inline() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        pool.run(&|_, _| {
            pool.run(&|_, _| {
                count.fetch_add(1, Ordering::Relaxed);
            });
        });
        assert_eq!(count.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn concurrent_callers_are_serialized() {
        let pool = ThreadPool::new(2);
        let count = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..100 {
                        pool.run(&|_, _| {
                            count.fetch_add(1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(count.load(Ordering::Relaxed), 3 * 100 * 2);
    }

    #[test]
    fn physical_cores_is_positive() {
        assert!(physical_cores() >= 1);
    }
}
