//! What the fuzz targets share: input shapes that reach the interesting cases often,
//! reference implementations and invariant checks.
//!
//! A target (one file in `fuzz_targets/`) draws an `arbitrary` input, calls one entry
//! point of `tokenbatch-core`, and checks what its result must satisfy, not only that it
//! returned: bad input must come back as an `Error` (a panic is a finding), and a result
//! must keep the guarantees the documentation states.

pub mod packing;

use arbitrary::Arbitrary;

/// A signed integer, drawn mostly small (where packings and schedules are interesting)
/// and sometimes from the whole `i64` range (where the refusals and overflows are).
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Int {
    Tiny(u8),
    Small(u16),
    Any(i64),
}

impl Int {
    pub fn get(self) -> i64 {
        match self {
            Int::Tiny(v) => i64::from(v),
            Int::Small(v) => i64::from(v),
            Int::Any(v) => v,
        }
    }
}

/// An unsigned count, drawn like [`Int`].
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Count {
    Tiny(u8),
    Small(u16),
    Any(u64),
}

impl Count {
    pub fn get(self) -> u64 {
        match self {
            Count::Tiny(v) => u64::from(v),
            Count::Small(v) => u64::from(v),
            Count::Any(v) => v,
        }
    }
}

/// The option name at `index` in `names`, or an unknown name past the end, so that the
/// refusal of unknown options is exercised too.
pub fn name_or_unknown(names: &[&'static str], index: u8) -> &'static str {
    names
        .get(usize::from(index) % (names.len() + 1))
        .copied()
        .unwrap_or("unknown")
}
