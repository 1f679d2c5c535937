//! `batch_padded` over every option: exactly the reference batches, `count x longest`
//! within the budget, batches as runs of the length order, errors for bad input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenbatch_fuzz::packing::{run, PackCase};

fuzz_target!(|case: PackCase| run(&case, true));
