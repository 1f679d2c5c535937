//! tokenbatch-core: the pure-Rust engine behind the `tokenbatch` Python package.
//!
//! Nothing in this crate knows about Python. Functions take slices and return owned
//! vectors or plain structs, and report bad input through [`Error`] instead of
//! panicking, so the binding crate can map every failure to a precise Python exception.

mod buffers;
pub mod context_parallel;
pub mod deal;
pub mod error;
pub mod gather;
pub mod memory;
pub mod packing;
pub mod parallel;
pub mod rng;
pub mod schedule;

pub use error::{Error, Result};
