//! Cache prefetch hints, for loops that read columns in order but spend long enough on
//! each value that the hardware's own prefetching does not run far enough ahead.

/// Ask for the cache line holding `address` to be loaded; a hint, which reads nothing.
#[inline(always)]
pub(crate) fn prefetch(address: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes no state a program can see, whatever
    // the address (one past the end of a buffer included).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(address.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = address;
}
