//! Option names matched in a column of fixed-width strings: for any width, names (any code
//! points, equal ones, longer than the strings), codes and strings, each string's code is
//! that of the first name it equals once both are lowercased as the core defines it
//! (`A`-`Z` and the Kelvin sign), NaN where it equals none, bit for bit; with sets of
//! names (`recompute="core_attn+mlp"`), a string that equals no name has the code of its
//! parts joined by `+`, each equal to a part's name, or NaN.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tokenbatch_core::memory::{name_codes, NameSets, NameTable};

/// A code point: mostly near the names (letters of both cases, the Kelvin sign, the
/// padding zero), sometimes any `u32` at all.
#[derive(Debug, Clone, Copy, Arbitrary)]
enum Char {
    Letter(u8),
    Kelvin,
    Zero,
    Plus,
    Any(u32),
}

/// Sets of names: the parts' names, their bits, the code of the empty set.
type Parts = (Vec<Vec<u32>>, Vec<u32>, f64);

/// The separator of sets of names.
const PLUS: u32 = 0x2B;

impl Char {
    fn get(self) -> u32 {
        match self {
            // a-c and A-C: strings often equal a name, in some case.
            Char::Letter(n) => [0x61, 0x62, 0x63, 0x41, 0x42, 0x43][usize::from(n % 6)],
            Char::Kelvin => 0x212A,
            Char::Zero => 0,
            Char::Plus => PLUS,
            Char::Any(c) => c,
        }
    }
}

/// Names of parts with their bits, and the code of the empty set.
#[derive(Debug, Arbitrary)]
struct Sets(Vec<(Vec<Char>, u32)>, f64);

#[derive(Debug, Arbitrary)]
struct Case {
    width: u8,
    names: Vec<(Vec<Char>, f64)>,
    rows: Vec<Vec<Char>>,
    sets: Option<Sets>,
    /// Code points past the last whole row (ignored, as `name_codes` reads whole rows).
    tail: Vec<Char>,
}

fn fold(c: u32) -> u32 {
    match c {
        0x212A => 0x6B,
        0x41..=0x5A => c + 0x20,
        c => c,
    }
}

fuzz_target!(|case: Case| {
    let width = usize::from(case.width % 40);
    let names: Vec<Vec<u32>> = case
        .names
        .iter()
        .map(|(name, _)| name.iter().map(|c| c.get()).collect())
        .collect();
    let codes: Vec<f64> = case.names.iter().map(|&(_, code)| code).collect();
    let rows: Vec<Vec<u32>> = case
        .rows
        .iter()
        .map(|row| {
            let mut row: Vec<u32> = row.iter().map(|c| c.get()).collect();
            row.resize(width, 0);
            row
        })
        .collect();
    let mut text: Vec<u32> = rows.concat();
    text.extend(
        case.tail
            .iter()
            .take(width.saturating_sub(1))
            .map(|c| c.get()),
    );

    let table = NameTable::new(width, &names, &codes);
    let parts: Option<Parts> = case.sets.as_ref().map(|Sets(parts, base)| {
        (
            parts
                .iter()
                .map(|(name, _)| name.iter().map(|c| c.get()).collect())
                .collect(),
            parts.iter().map(|&(_, bit)| bit).collect(),
            *base,
        )
    });
    let table = match &parts {
        Some((names, bits, base)) => table.with_sets(NameSets::new(PLUS, names, bits, *base)),
        None => table,
    };
    let found = name_codes(&text, &table);
    if width == 0 {
        assert!(found.is_empty());
        return;
    }
    assert_eq!(found.len(), rows.len());
    for (row, found) in rows.iter().zip(&found) {
        let expected = names
            .iter()
            .zip(&codes)
            .find(|(name, _)| {
                name.len() <= width
                    && (0..width).all(|i| fold(row[i]) == fold(name.get(i).copied().unwrap_or(0)))
            })
            .map_or(f64::NAN, |(_, &code)| code);
        let expected = match &parts {
            Some((names, bits, base)) if expected.is_nan() => set_code(row, names, bits, *base),
            _ => expected,
        };
        assert_eq!(
            found.to_bits(),
            expected.to_bits(),
            "{row:?} among {names:?}"
        );
    }
});

/// The code of `row` as a set of parts: the row up to its padding zeros, split at each
/// `+`, every piece equal (lowercased) to some part's name, the bits of the first such
/// part of each or-ed onto `base`; NaN where a piece equals no part.
fn set_code(row: &[u32], names: &[Vec<u32>], bits: &[u32], base: f64) -> f64 {
    let end = row.iter().rposition(|&c| c != 0).map_or(0, |last| last + 1);
    let mut code = 0;
    for piece in row[..end].split(|&c| c == PLUS) {
        let found = names.iter().zip(bits).find(|(name, _)| {
            name.len() == piece.len() && name.iter().zip(piece).all(|(&a, &b)| fold(a) == fold(b))
        });
        match found {
            Some((_, &bit)) => code |= bit,
            None => return f64::NAN,
        }
    }
    base + f64::from(code)
}
