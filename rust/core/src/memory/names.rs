//! Named choices (`recompute="full"`, `attention="eager"`...) read from numpy string arrays.
//!
//! numpy keeps a `<U` array as fixed-width rows of UTF-32 code points padded with zeros.
//! A column of a million names is matched here, a few vector comparisons per row, rather
//! than by a dictionary look-up per value in Python.

use rayon::prelude::*;

use crate::buffers::zeroed_vec;

/// Rows matched per parallel task.
const CHUNK: usize = 4096;

/// The names of one option, each with its code, for strings `width` code points wide.
///
/// A string matches a name when it equals it after lowercasing, as Python's `str.lower`
/// does for every string that could equal a name: the names are lowercase ASCII, and
/// the only code points whose lowercase is ASCII are `A`-`Z` and the Kelvin sign.
#[derive(Debug, Clone)]
pub struct NameTable {
    width: usize,
    /// The names padded to `width` (a longer name equals no string), the last first, so
    /// that the first of equal names is the one that stays.
    padded: Vec<(Vec<u32>, f64)>,
}

impl NameTable {
    /// `names[i]` (code points) has code `codes[i]`; names are matched in lowercase.
    pub fn new(width: usize, names: &[Vec<u32>], codes: &[f64]) -> Self {
        let padded = names
            .iter()
            .zip(codes)
            .rev()
            .filter(|(name, _)| name.len() <= width)
            .map(|(name, &code)| {
                let mut row: Vec<u32> = name.iter().map(|&c| fold(c)).collect();
                row.resize(width, 0);
                (row, code)
            })
            .collect();
        NameTable { width, padded }
    }

    /// Code points per string.
    pub fn width(&self) -> usize {
        self.width
    }

    /// The code of the string `row` (`width` code points), or NaN.
    #[inline]
    pub fn code(&self, row: &[u32]) -> f64 {
        let mut code = [0.0];
        self.codes_into(row, &mut code);
        code[0]
    }

    /// The code of each string of `text` (`out.len()` strings of `width` code points), or
    /// NaN where it matches no name.
    pub fn codes_into(&self, text: &[u32], out: &mut [f64]) {
        // Names are short: a width known at compile time makes each comparison a few
        // vector instructions instead of a loop over code points.
        macro_rules! with_width {
            ($($w:literal)*) => {
                match self.width {
                    $($w => self.codes_of::<$w>(text, out),)*
                    _ => self.codes_of_any_width(text, out),
                }
            };
        }
        with_width!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16);
    }

    /// [`NameTable::codes_into`] for `W`-wide strings. Every name is compared in full,
    /// with no branch on which one matches: a column's names come in no order a predictor
    /// learns.
    #[inline(always)]
    fn codes_of<const W: usize>(&self, text: &[u32], out: &mut [f64]) {
        let mut names = [([0u32; W], 0.0f64); MAX_FAST_NAMES];
        let mut count = 0;
        for (name, code) in &self.padded {
            if let (Some(slot), Ok(name)) = (names.get_mut(count), <[u32; W]>::try_from(&name[..]))
            {
                *slot = (name, *code);
                count += 1;
            } else {
                return self.codes_of_any_width(text, out);
            }
        }
        let names = &names[..count];
        for (code, row) in out.iter_mut().zip(text.chunks_exact(W)) {
            let mut folded = [0u32; W];
            for (f, &c) in folded.iter_mut().zip(row) {
                *f = fold_ascii(c);
            }
            let bits = names
                .iter()
                .fold(f64::NAN.to_bits(), |bits, (name, known)| {
                    let differs = name.iter().zip(&folded).fold(0, |d, (a, b)| d | (a ^ b));
                    // All ones where the name matches: a mask, which the compiler keeps as one.
                    let matches = u64::from(differs == 0).wrapping_neg();
                    (known.to_bits() & matches) | (bits & !matches)
                });
            *code = f64::from_bits(bits);
            if code.is_nan() && row.contains(&KELVIN_SIGN) {
                // Rare: folded in full, one code point at a time.
                self.codes_of_any_width(row, std::slice::from_mut(code));
            }
        }
    }

    /// [`NameTable::codes_into`] for strings of any width or tables of many names.
    fn codes_of_any_width(&self, text: &[u32], out: &mut [f64]) {
        for (code, row) in out.iter_mut().zip(text.chunks_exact(self.width)) {
            *code = self.padded.iter().fold(f64::NAN, |code, (name, known)| {
                let same = name.iter().zip(row).all(|(&a, &b)| a == fold(b));
                if same {
                    *known
                } else {
                    code
                }
            });
        }
    }
}

/// Names a table compares without a loop over them (the longest table, dtypes, has 8).
const MAX_FAST_NAMES: usize = 8;

/// The one code point besides `A`-`Z` whose lowercase (in Python's `str.lower`) is ASCII.
const KELVIN_SIGN: u32 = 0x212A;

/// A code point lowercased where its lowercase is ASCII (`A`-`Z`, and the Kelvin sign to
/// `k`, as Python's `str.lower` does); any other is left as it is.
#[inline(always)]
fn fold(c: u32) -> u32 {
    if c == KELVIN_SIGN {
        u32::from(b'k')
    } else {
        fold_ascii(c)
    }
}

/// `A`-`Z` lowercased, without a branch (so that a row folds in a few vector instructions).
#[inline(always)]
fn fold_ascii(c: u32) -> u32 {
    c + (u32::from(c.wrapping_sub(u32::from(b'A')) < 26) << 5)
}

/// For each fixed-width string of `text` (the table's width in code points, padded with
/// zeros, as numpy stores `<U` arrays), the code of the first name it equals in lowercase,
/// or NaN. In parallel.
pub fn name_codes(text: &[u32], table: &NameTable) -> Vec<f64> {
    let width = table.width;
    if width == 0 {
        return Vec::new();
    }
    // Every element is written below: lazily zeroed pages, not a pass that fills them.
    let mut found = zeroed_vec!(f64, text.len() / width);
    found
        .par_chunks_mut(CHUNK)
        .zip(text.par_chunks(CHUNK * width))
        .for_each(|(found, text)| table.codes_into(text, found));
    found
}
