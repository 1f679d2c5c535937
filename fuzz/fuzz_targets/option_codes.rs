//! Option names parsed in a column of fixed-width strings (numpy's `<U` rows): for any
//! option, width and strings, each string's value is bit for bit what parsing it alone
//! gives (its trailing zeros, numpy's padding, removed), NaN where that is an error or the
//! code points are no string; an option that takes no names is an error.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenbatch_core::memory::{option_code, option_codes};

/// Options, one that takes no names among them.
const OPTIONS: [&str; 10] = [
    "recompute",
    "attention",
    "loss",
    "cp_comm",
    "activation_model",
    "pipeline_split",
    "optimizer",
    "param_dtype",
    "logits_dtype",
    "dp",
];

/// Pieces of strings: mostly near the names, sometimes any `u32` at all.
#[derive(Debug, Clone, Arbitrary)]
enum Piece {
    Name(u8),
    Letter(u8),
    Kelvin,
    Zero,
    Plus,
    Any(u32),
}

const NAMES: [&str; 8] = [
    "full",
    "core_attn",
    "MLP",
    "eager",
    "a2a",
    "bf16",
    "Auto",
    "sgd",
];

impl Piece {
    fn push(&self, row: &mut Vec<u32>) {
        match *self {
            Piece::Name(i) => {
                row.extend(NAMES[usize::from(i) % NAMES.len()].chars().map(u32::from))
            }
            Piece::Letter(c) => row.push(u32::from(b'A' + c % 58)),
            Piece::Kelvin => row.push(0x212A),
            Piece::Zero => row.push(0),
            Piece::Plus => row.push(u32::from('+')),
            Piece::Any(c) => row.push(c),
        }
    }
}

fuzz_target!(|input: (u8, u8, Vec<Vec<Piece>>)| {
    let (option, width, strings) = input;
    let option = OPTIONS[usize::from(option) % OPTIONS.len()];
    let width = usize::from(width % 24) + 1;
    let rows: Vec<Vec<u32>> = strings
        .iter()
        .map(|pieces| {
            let mut row = Vec::new();
            for piece in pieces {
                piece.push(&mut row);
            }
            row.resize(width, 0);
            row
        })
        .collect();
    let flat: Vec<u32> = rows.concat();
    let Ok(codes) = option_codes(option, &flat, width) else {
        assert_eq!(option, "dp");
        return;
    };
    assert_eq!(codes.len(), rows.len());
    for (row, code) in rows.iter().zip(codes) {
        let end = row.iter().rposition(|&c| c != 0).map_or(0, |last| last + 1);
        let name: Option<String> = row[..end].iter().map(|&c| char::from_u32(c)).collect();
        let alone = name.and_then(|name| option_code(option, &name).ok());
        assert_eq!(
            alone.map_or(f64::NAN.to_bits(), f64::to_bits),
            code.to_bits(),
            "{row:?}"
        );
    }
});
