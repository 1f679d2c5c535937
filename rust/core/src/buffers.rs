//! Large zeroed buffers backed by transparent huge pages where the kernel allows it, and
//! read-only zeros shared by the whole process.
//!
//! Packing 10M sequences writes a few hundred megabytes of fresh memory; with 4 KiB
//! pages the page faults alone cost more than the packing. `vec![0; n]` is a lazily
//! mapped zeroed allocation, so advising it before the first write lets the kernel
//! back it with 2 MiB pages (Linux `madvise(MADV_HUGEPAGE)`, honoured in the common
//! `madvise` THP mode). Elsewhere this is a plain zeroed vector.

/// Below this size huge pages do not pay.
const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// A zeroed vector of `n` elements, advised for huge pages when large.
macro_rules! zeroed_vec {
    ($t:ty, $n:expr) => {{
        let v: Vec<$t> = vec![<$t>::default(); $n];
        $crate::buffers::advise_huge_pages(&v);
        v
    }};
}
pub(crate) use zeroed_vec;

/// An empty vector with room for `n` elements, advised for huge pages when large (the
/// reserved memory is not touched until pushed to).
pub fn with_capacity_huge<T>(n: usize) -> Vec<T> {
    let mut v = Vec::with_capacity(n);
    advise_huge_pages(v.spare_capacity_mut());
    v
}

/// Ask the kernel for huge pages under `buffer`'s not yet touched memory.
pub fn advise_huge_pages<T>(buffer: &[T]) {
    let bytes = std::mem::size_of_val(buffer);
    if bytes < HUGE_PAGE_MIN_BYTES {
        return;
    }
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        let start = (buffer.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (buffer.as_ptr() as usize + bytes) / HUGE * HUGE;
        if end > start {
            // SAFETY: madvise only changes how the kernel backs pages of this live
            // allocation (a hint); it never changes its contents or validity.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
}

/// `n` read-only zeros, shared by the whole process.
///
/// A zeroed allocation is not free in a process that has freed memory before: glibc serves
/// it from memory it kept (threads' arenas above all) and clears it, page faults included,
/// which for the starts of a packing of a million sequences costs more than a tenth of the
/// packing. These zeros are a read-only anonymous mapping that is never written, so every
/// page of it is the kernel's one zero page, mapped on first read. The mapping grows (to
/// twice the largest request) by mapping anew; earlier mappings stay, since slices of
/// them may live anywhere. Where no such mapping can be made, `None`.
pub fn shared_zeros(n: usize) -> Option<&'static [i64]> {
    #[cfg(unix)]
    {
        use std::sync::Mutex;
        static ZEROS: Mutex<&'static [i64]> = Mutex::new(&[]);
        let mut zeros = ZEROS
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if zeros.len() < n {
            let len = n.checked_mul(2)?;
            let bytes = len.checked_mul(std::mem::size_of::<i64>())?;
            // SAFETY: a fresh private anonymous read-only mapping, not aliased by anything;
            // anonymous memory reads as zeros, a valid `i64` each, and the mapping is never
            // unmapped, so the slice may live as long as the process.
            *zeros = unsafe {
                let address = libc::mmap(
                    std::ptr::null_mut(),
                    bytes,
                    libc::PROT_READ,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                );
                if address == libc::MAP_FAILED {
                    return None;
                }
                std::slice::from_raw_parts(address.cast::<i64>(), len)
            };
        }
        Some(&zeros[..n])
    }
    #[cfg(not(unix))]
    {
        let _ = n;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_zeros_are_zeros_of_the_asked_length() {
        for n in [0, 1, 1000, 3 << 20, 10] {
            let zeros = shared_zeros(n).unwrap();
            assert_eq!(zeros.len(), n);
            assert!(zeros.iter().all(|&z| z == 0));
        }
    }
}
