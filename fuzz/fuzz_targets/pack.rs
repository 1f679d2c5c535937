//! `pack` over every algorithm and option: exactly the reference packing, every sequence
//! (every token, under split) once, no bin over the budget or `max_seqs`, errors for bad
//! input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenbatch_fuzz::packing::{run, PackCase};

fuzz_target!(|case: PackCase| run(&case, false));
