//! Large zeroed buffers backed by transparent huge pages where the kernel allows it.
//!
//! Packing 10M sequences writes a few hundred megabytes of fresh memory; with 4 KiB
//! pages the page faults alone cost more than the packing. `vec![0; n]` is a lazily
//! mapped zeroed allocation, so advising it before the first write lets the kernel
//! back it with 2 MiB pages (Linux `madvise(MADV_HUGEPAGE)`, honoured in the common
//! `madvise` THP mode). Elsewhere this is a plain zeroed vector.
//!
//! Kept for packing because it pays: without the advice, the first `tb.pack` of a fresh
//! process spends 16% more CPU time at 1M lengths and 14% at 10M (benches/RESULTS.md).

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
