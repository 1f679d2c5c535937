//! Named choices (`recompute="full"`, `attention="eager"`...) read from numpy string arrays.
//!
//! numpy keeps a `<U` array as fixed-width rows of UTF-32 code points padded with zeros.
//! A column of a million names is matched here, a few vector comparisons per row, rather
//! than by a dictionary look-up per value in Python.

use rayon::prelude::*;

use crate::buffers::zeroed_vec;
use crate::prefetch::prefetch;

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
    /// How a string finds the one name it may equal, where two code points tell the names
    /// apart (see [`Picker`]).
    picker: Option<Picker>,
    /// Names made of parts, matched where a string equals no name.
    sets: Option<NameSets>,
}

/// Names made of parts joined by a separator, each part a bit of the code: the code of
/// `"core_attn+mlp"` is `base` plus the bits of `core_attn` and `mlp` (any order, a part
/// named twice counted once). A string with an unknown or empty part matches nothing.
#[derive(Debug, Clone)]
pub struct NameSets {
    separator: u32,
    /// Each part's name (lowercase) and bit.
    parts: Vec<(Vec<u32>, u32)>,
    base: f64,
}

impl NameSets {
    /// Parts named `parts[i]` (code points) with bit `bits[i]`, joined by `separator`.
    pub fn new(separator: u32, parts: &[Vec<u32>], bits: &[u32], base: f64) -> Self {
        NameSets {
            separator,
            parts: parts
                .iter()
                .zip(bits)
                .map(|(name, &bit)| (name.iter().map(|&c| fold(c)).collect(), bit))
                .collect(),
            base,
        }
    }

    /// The code of `row` (code points padded with zeros), or NaN.
    fn code(&self, row: &[u32]) -> f64 {
        let end = row.iter().rposition(|&c| c != 0).map_or(0, |last| last + 1);
        let mut bits = 0;
        for part in row[..end].split(|&c| c == self.separator) {
            let found = self.parts.iter().find(|(name, _)| {
                name.len() == part.len() && name.iter().zip(part).all(|(&a, &b)| a == fold(b))
            });
            match found {
                Some(&(_, bit)) => bits |= bit,
                None => return f64::NAN,
            }
        }
        self.base + f64::from(bits)
    }
}

/// Two positions at which every two different names differ in some code point, and for
/// each pair of ASCII code points there, the name (its index in `padded`, or
/// [`Picker::NONE`]) a string holding them may equal: a string is then compared with that
/// one name instead of every name.
#[derive(Debug, Clone)]
struct Picker {
    positions: (usize, usize),
    /// By `key(first, second)`: 2^14 bytes, in the core's first-level cache.
    candidates: Box<[u8]>,
}

impl Picker {
    const NONE: u8 = u8::MAX;

    /// The table's index of a pair of code points: the low seven bits of each (a string
    /// with others does not equal the name it finds, and is told so by its comparison).
    #[inline(always)]
    fn key(first: u32, second: u32) -> usize {
        (first & 0x7F) as usize | ((second & 0x7F) as usize) << 7
    }

    /// The index in `padded` of the one name `row` may equal (past the end: none). The
    /// table holds each name's pair in every case, so that the string's code points are
    /// looked up as they are.
    #[inline(always)]
    fn candidate(&self, row: &[u32]) -> usize {
        let (p, q) = self.positions;
        usize::from(self.candidates[Self::key(row[p], row[q])])
    }

    /// A picker for `padded` (folded names, the last first), or `None` where a name is
    /// not ASCII, no two positions tell every two names apart, or the strings are wider
    /// than [`NameTable::codes_into`] compares at a width known at compile time.
    fn new(width: usize, padded: &[(Vec<u32>, f64)]) -> Option<Self> {
        if width > MAX_PICKED_WIDTH
            || padded.len() >= usize::from(Self::NONE)
            || padded.iter().flat_map(|(name, _)| name).any(|&c| c >= 0x80)
        {
            return None;
        }
        // Past the longest name every name holds zeros: no position there tells two apart
        // (and a string dtype may be far wider than any name).
        let span = padded
            .iter()
            .filter_map(|(name, _)| name.iter().rposition(|&c| c != 0))
            .max()
            .map_or(1, |last| last + 1)
            .min(width);
        let (p, q) = (0..span)
            .flat_map(|p| (p..span).map(move |q| (p, q)))
            .find(|&(p, q)| {
                padded.iter().all(|(a, _)| {
                    padded
                        .iter()
                        .all(|(b, _)| a == b || (a[p], a[q]) != (b[p], b[q]))
                })
            })?;
        let mut candidates = vec![Self::NONE; 1 << 14].into_boxed_slice();
        // The first of equal names (the last in `padded`) is the one a string finds. A
        // name's pair in another case is no other name's (names are folded to lowercase).
        let cases = |c: u32| {
            if (u32::from(b'a')..=u32::from(b'z')).contains(&c) {
                [c, c - 32]
            } else {
                [c, c]
            }
        };
        for (index, (name, _)) in padded.iter().enumerate() {
            for first in cases(name[p]) {
                for second in cases(name[q]) {
                    candidates[Self::key(first, second)] = index as u8;
                }
            }
        }
        Some(Picker {
            positions: (p, q),
            candidates,
        })
    }
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
            .collect::<Vec<_>>();
        let picker = Picker::new(width, &padded);
        NameTable {
            width,
            padded,
            picker,
            sets: None,
        }
    }

    /// The table matching `sets` too, where a string equals none of its names.
    pub fn with_sets(self, sets: NameSets) -> Self {
        NameTable {
            sets: Some(sets),
            ..self
        }
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
        const _: () = assert!(MAX_PICKED_WIDTH == 16);
    }

    /// [`NameTable::codes_into`] for `W`-wide strings: each string is compared with the
    /// one name its [`Picker`] finds, folded and compared in a few vector instructions.
    #[inline(always)]
    fn codes_of<const W: usize>(&self, text: &[u32], out: &mut [f64]) {
        let Some(picker) = &self.picker else {
            return self.codes_of_any_width(text, out);
        };
        for (code, row) in out.iter_mut().zip(text.chunks_exact(W)) {
            // A column's rows are read in order, but too slowly for the hardware's own
            // prefetching to run ahead (measured: 2.4x slower without, once the column is
            // larger than the caches).
            prefetch(row.as_ptr().wrapping_add(PREFETCH_AHEAD).cast());
            *code = match self.padded.get(picker.candidate(row)) {
                // As written first: most strings are in lowercase, and comparing them
                // costs less than folding them.
                Some((name, known))
                    if same::<W>(name, row, |c| c) || same::<W>(name, row, fold_ascii) =>
                {
                    *known
                }
                _ => f64::NAN,
            };
            if code.is_nan() && (self.sets.is_some() || row.contains(&KELVIN_SIGN)) {
                // Rare (a set of names, or a bad one): folded in full, one code point at a
                // time.
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
            if let (true, Some(sets)) = (code.is_nan(), &self.sets) {
                *code = sets.code(row);
            }
        }
    }
}

/// Whether `row`, each code point mapped by `fold`, is `name`, both `W` code points: a few
/// vector instructions, with no branch per code point.
#[inline(always)]
fn same<const W: usize>(name: &[u32], row: &[u32], fold: impl Fn(u32) -> u32) -> bool {
    match (<&[u32; W]>::try_from(name), <&[u32; W]>::try_from(row)) {
        (Ok(name), Ok(row)) => {
            name.iter()
                .zip(row)
                .fold(0, |differs, (&a, &b)| differs | (a ^ fold(b)))
                == 0
        }
        _ => false,
    }
}

/// The widest strings matched through a [`Picker`] (those of a width known at compile
/// time in [`NameTable::codes_into`]).
const MAX_PICKED_WIDTH: usize = 16;

/// Code points of a column ahead of the row being matched that [`prefetch`] asks for
/// (about 28 rows of 9, the width of `"selective"`).
const PREFETCH_AHEAD: usize = 256;

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
