//! `gather_segments`: the concatenation of the slices, or an error for a segment that is
//! negative or reaches past the values (never an out-of-bounds read).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenbatch_core::gather::gather_segments;
use tokenbatch_fuzz::Int;

#[derive(Debug, Arbitrary)]
struct Case {
    values: Vec<u16>,
    segments: Vec<(Int, Int)>,
    /// A length array of another size than the starts.
    extra_length: Option<Int>,
}

fuzz_target!(|case: Case| {
    let starts: Vec<i64> = case.segments.iter().map(|s| s.0.get()).collect();
    let mut lengths: Vec<i64> = case.segments.iter().map(|s| s.1.get()).collect();
    lengths.extend(case.extra_length.map(Int::get));
    let result = gather_segments(&case.values, &starts, &lengths);
    let expected: Option<Vec<u16>> = if starts.len() != lengths.len() {
        None
    } else {
        starts
            .iter()
            .zip(&lengths)
            .map(|(&start, &length)| {
                let first = usize::try_from(start).ok()?;
                let end = first.checked_add(usize::try_from(length).ok()?)?;
                case.values.get(first..end)
            })
            .collect::<Option<Vec<&[u16]>>>()
            .map(|slices| slices.concat())
    };
    match (result, expected) {
        (Ok(out), Some(expected)) => assert_eq!(out, expected),
        (Err(_), None) => {}
        (result, expected) => panic!("got {result:?}, expected {expected:?}"),
    }
});
