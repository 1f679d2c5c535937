//! The thread pool behind every parallel computation of the core.
//!
//! Callers run parallel work through [`install`], which uses a pool private to tokenbatch
//! (so the thread count can change at run time, unlike rayon's global pool) and owned by
//! the current process. Two things make it safe to use across `fork` (PyTorch DataLoader
//! workers fork a process that has usually packed already):
//! - after `fork` the parent's pool threads do not exist in the child, so the child builds
//!   a pool of its own on first use, and never drops the parent's (see [`Pools::current`]);
//! - no lock of this module can be inherited held by a thread that does not exist in the
//!   child: the thread count is an atomic, and the pool slot is locked around `fork` by
//!   `pthread_atfork` handlers, so the child always finds it free.
//!
//! If the pool cannot be built (the system refuses more threads), the failure is kept for
//! that process and thread count (not retried on every call), reported once through
//! [`take_failure`], and work runs on the calling thread instead.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rayon::{ThreadPool, ThreadPoolBuildError, ThreadPoolBuilder};

use crate::error::{at_least_usize, Error, Result};

/// A pool, or why it could not be built, for one process and thread count.
struct Pool {
    process: u32,
    threads: usize,
    pool: std::result::Result<Arc<ThreadPool>, String>,
}

/// Builds a pool of the given number of threads (a parameter so tests can make it fail).
type Build = fn(usize) -> std::result::Result<ThreadPool, ThreadPoolBuildError>;

/// What the pool slot holds.
struct Slot {
    pool: Option<Pool>,
    /// Why the last build failed, until [`take_failure`] reports it.
    unreported_failure: Option<String>,
}

/// The pool slot of a process, and how pools are built.
struct Pools {
    slot: Mutex<Slot>,
    build: Build,
}

fn build_pool(threads: usize) -> std::result::Result<ThreadPool, ThreadPoolBuildError> {
    ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|index| format!("tokenbatch-{index}"))
        .build()
}

static POOLS: Pools = Pools::new(build_pool);

/// Threads requested by [`set_num_threads`]; 0 means the default. An atomic, not a lock:
/// a child process must be able to read it whatever the parent's threads were doing.
static REQUESTED_THREADS: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pools {
    const fn new(build: Build) -> Self {
        Self {
            slot: Mutex::new(Slot {
                pool: None,
                unreported_failure: None,
            }),
            build,
        }
    }

    /// This process's pool of `threads` threads, built on first use.
    fn current(&self, threads: usize) -> std::result::Result<Arc<ThreadPool>, String> {
        let process = std::process::id();
        let matches = |pool: &&Pool| pool.process == process && pool.threads == threads;
        if let Some(pool) = lock(&self.slot).pool.as_ref().filter(matches) {
            return pool.pool.clone();
        }
        // Built outside the lock: spawning threads takes a while, and a `fork` meanwhile
        // must not wait for it.
        let built = (self.build)(threads)
            .map(Arc::new)
            .map_err(|error| format!("could not start {threads} threads: {error}"));
        let mut slot = lock(&self.slot);
        if let Some(pool) = slot.pool.as_ref().filter(matches) {
            return pool.pool.clone(); // another thread was first; `built` is dropped
        }
        if let Err(reason) = &built {
            slot.unreported_failure = Some(reason.clone());
        }
        let previous = slot.pool.replace(Pool {
            process,
            threads,
            pool: built.clone(),
        });
        drop(slot);
        if let Some(previous) = previous {
            if previous.process != process {
                // The parent's pool, inherited through `fork`: its threads do not exist
                // here, and dropping it would wake them through their sleep mutexes, any
                // of which a parent thread may have held at the moment of the fork, which
                // blocks this process forever. So it is leaked, deliberately: a few
                // hundred bytes per fork.
                std::mem::forget(previous);
            }
        }
        built
    }

    /// Run `work` in this process's pool of `threads` threads, or on the calling thread
    /// if that pool could not be built.
    fn install<R: Send>(&self, threads: usize, work: impl FnOnce() -> R + Send) -> R {
        match self.current(threads) {
            Ok(pool) => pool.install(work),
            Err(_) => on_calling_thread(work),
        }
    }
}

thread_local! {
    /// A one-thread pool made of the calling thread itself (it spawns nothing), for work
    /// whose pool could not be built. Rayon keeps such a pool's registry alive with the
    /// thread; it exists only on threads that hit a failure.
    static CALLING_THREAD_POOL: Option<ThreadPool> = ThreadPoolBuilder::new()
        .num_threads(1)
        .use_current_thread()
        .build()
        .ok();
}

/// Run `work` (and the parallel iterators inside it) on the calling thread alone.
fn on_calling_thread<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    CALLING_THREAD_POOL.with(|pool| match pool {
        Some(pool) => pool.install(work),
        // Not even a pool of the calling thread: rayon's global pool is all that is left.
        None => work(),
    })
}

/// Threads used when none were requested: `TOKENBATCH_NUM_THREADS` or all cores.
fn default_threads() -> usize {
    std::env::var("TOKENBATCH_NUM_THREADS")
        .ok()
        .and_then(|value| value.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Set the number of threads of later parallel work (`None`: back to the default).
pub fn set_num_threads(threads: Option<i64>) -> Result<()> {
    let threads = match threads {
        None => 0,
        Some(n) => at_least_usize(n, 1, "num_threads").map_err(|_| {
            Error::invalid(format!(
                "num_threads must be at least 1 (or None for the default), got {n}"
            ))
        })?,
    };
    REQUESTED_THREADS.store(threads, Ordering::Relaxed);
    Ok(())
}

/// The number of threads parallel work uses.
pub fn num_threads() -> usize {
    match REQUESTED_THREADS.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// Run `work` inside this process's pool, so its rayon parallel iterators use it.
///
/// If the pool cannot be built, `work` runs on the calling thread, and the reason is kept
/// for [`take_failure`]; the build is tried again only for another thread count or in
/// another process.
pub fn install<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    register_fork_handlers();
    POOLS.install(num_threads(), work)
}

/// Why the pool could not be built, once per failure (then `None` until the next one).
pub fn take_failure() -> Option<String> {
    POOLS.take_failure()
}

impl Pools {
    fn take_failure(&self) -> Option<String> {
        lock(&self.slot).unreported_failure.take()
    }
}

/// Lock the pool slot around `fork`, so that the child never inherits it locked by a
/// thread that does not exist there.
fn register_fork_handlers() {
    #[cfg(unix)]
    {
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        REGISTERED.call_once(|| {
            // SAFETY: the handlers are plain `extern "C"` functions that live as long as
            // the program; registration has no other effect.
            unsafe {
                libc::pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork));
            }
        });
    }
}

thread_local! {
    /// The pool slot's guard, held by the forking thread while `fork` runs.
    static HELD_FOR_FORK: RefCell<Option<MutexGuard<'static, Slot>>> =
        const { RefCell::new(None) };
}

/// Runs in the forking thread just before `fork`: wait until no thread holds the slot.
#[cfg(unix)]
extern "C" fn before_fork() {
    let guard = lock(&POOLS.slot);
    HELD_FOR_FORK.with(|held| *held.borrow_mut() = Some(guard));
}

/// Runs in the parent and in the child just after `fork`, in the forking thread: free
/// the slot again.
#[cfg(unix)]
extern "C" fn after_fork() {
    HELD_FOR_FORK.with(|held| held.borrow_mut().take());
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use rayon::prelude::*;

    use super::*;

    #[test]
    fn install_uses_the_requested_thread_count() {
        set_num_threads(Some(3)).unwrap();
        assert_eq!(install(rayon::current_num_threads), 3);
        let total: u64 = install(|| (0..10_000u64).into_par_iter().sum());
        assert_eq!(total, 49_995_000);
        set_num_threads(None).unwrap();
        assert_eq!(num_threads(), default_threads());
        assert!(set_num_threads(Some(0)).is_err());
        assert!(set_num_threads(Some(-2)).is_err());
    }

    static ATTEMPTS: AtomicUsize = AtomicUsize::new(0);

    fn refuse_threads(threads: usize) -> std::result::Result<ThreadPool, ThreadPoolBuildError> {
        ATTEMPTS.fetch_add(1, Ordering::SeqCst);
        ThreadPoolBuilder::new()
            .num_threads(threads)
            .spawn_handler(|_| Err(std::io::Error::other("no threads allowed")))
            .build()
    }

    #[test]
    fn a_failed_build_is_kept_reported_once_and_work_still_runs() {
        let pools = Pools::new(refuse_threads);
        let sum = || (0..10_000u64).into_par_iter().sum::<u64>();
        assert_eq!(pools.install(4, sum), 49_995_000);
        let reason = pools.take_failure().unwrap();
        assert!(reason.contains("could not start 4 threads"), "{reason}");
        assert!(reason.contains("no threads allowed"), "{reason}");
        assert_eq!(pools.install(4, rayon::current_num_threads), 1);
        assert_eq!(pools.install(4, sum), 49_995_000);
        assert_eq!(
            ATTEMPTS.load(Ordering::SeqCst),
            1,
            "built once, not per call"
        );
        assert_eq!(pools.take_failure(), None, "reported once");
        // Another thread count is another pool: tried (and reported) again.
        assert_eq!(pools.install(2, sum), 49_995_000);
        assert_eq!(ATTEMPTS.load(Ordering::SeqCst), 2);
        assert!(pools.take_failure().is_some());
    }
}
