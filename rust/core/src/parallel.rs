//! The thread pool behind every parallel computation of the core.
//!
//! Callers run parallel work through [`install`], which uses a pool private to tokenbatch
//! (so the thread count can change at run time, unlike rayon's global pool) and owned by
//! the current process: after `fork` (PyTorch DataLoader workers) the parent's pool
//! threads do not exist in the child, and a job queued to them would never run, so a
//! child builds its own pool on first use instead of deadlocking.

use std::sync::{Arc, Mutex, PoisonError};

use rayon::{ThreadPool, ThreadPoolBuilder};

use crate::error::{Error, Result};

struct Pool {
    process: u32,
    threads: usize,
    pool: Arc<ThreadPool>,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);
static REQUESTED_THREADS: Mutex<Option<usize>> = Mutex::new(None);

/// Threads used when none were requested: `TOKENBATCH_NUM_THREADS` or all cores.
fn default_threads() -> usize {
    std::env::var("TOKENBATCH_NUM_THREADS")
        .ok()
        .and_then(|value| value.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Set the number of threads of later parallel work (`None`: back to the default).
pub fn set_num_threads(threads: Option<usize>) -> Result<()> {
    if threads == Some(0) {
        return Err(Error::invalid(
            "num_threads must be at least 1 (or None for the default)",
        ));
    }
    *REQUESTED_THREADS
        .lock()
        .unwrap_or_else(PoisonError::into_inner) = threads;
    Ok(())
}

/// The number of threads parallel work uses.
pub fn num_threads() -> usize {
    REQUESTED_THREADS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .unwrap_or_else(default_threads)
}

/// Run `work` inside this process's pool, so its rayon parallel iterators use it.
///
/// If the pool cannot be built (no threads allowed), `work` runs on the calling thread
/// under rayon's own fallback.
pub fn install<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    let threads = num_threads();
    let process = std::process::id();
    let pool = {
        let mut slot = POOL.lock().unwrap_or_else(PoisonError::into_inner);
        let current = slot
            .as_ref()
            .filter(|pool| pool.process == process && pool.threads == threads);
        match current {
            Some(pool) => Some(Arc::clone(&pool.pool)),
            None => match ThreadPoolBuilder::new().num_threads(threads).build() {
                Ok(built) => {
                    let built = Arc::new(built);
                    *slot = Some(Pool {
                        process,
                        threads,
                        pool: Arc::clone(&built),
                    });
                    Some(built)
                }
                Err(_) => None,
            },
        }
    };
    match pool {
        Some(pool) => pool.install(work),
        None => work(),
    }
}

#[cfg(test)]
mod tests {
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
    }
}
