//! Evaluation of many configurations at once: a broadcast grid, or a list of configurations
//! (a grid of one axis whose inputs are columns), through one loop.
//!
//! Each layout field arrives as a compact buffer plus element strides over the common
//! output shape (a stride of 0 repeats a value along that axis, as numpy broadcasting
//! does), so a grid of millions of cells never materializes its broadcast inputs.

use rayon::prelude::*;

use crate::buffers::zeroed_vec;
use crate::error::{Error, Result};
use crate::memory::breakdown::{Breakdown, N_OUTPUT_FIELDS};
use crate::memory::estimate::{estimate, estimate_stages, Estimator};
use crate::memory::layout::{field_rule, Invalid, Layout, LAYOUT_FIELDS, N_LAYOUT_FIELDS};
use crate::memory::numeric::is_whole_in;
use crate::memory::prepared::Prepared;
use crate::memory::spec::ModelSpec;

/// The values of one input, as the caller has them: floats, or integers (64- or 32-bit) or
/// booleans read as floats where a cell needs them (a list of a million configurations is
/// mostly integer and boolean columns, which are then never copied).
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    F64(&'a [f64]),
    I64(&'a [i64]),
    I32(&'a [i32]),
    Bool(&'a [bool]),
}

impl Values<'_> {
    pub fn len(&self) -> usize {
        match self {
            Values::F64(values) => values.len(),
            Values::I64(values) => values.len(),
            Values::I32(values) => values.len(),
            Values::Bool(values) => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Value `index`; the caller has checked the bounds.
    #[inline]
    pub fn get(&self, index: usize) -> f64 {
        match self {
            Values::F64(values) => values[index],
            Values::I64(values) => values[index] as f64,
            Values::I32(values) => f64::from(values[index]),
            Values::Bool(values) => f64::from(u8::from(values[index])),
        }
    }
}

impl<'a> From<&'a [f64]> for Values<'a> {
    fn from(values: &'a [f64]) -> Self {
        Values::F64(values)
    }
}

/// One broadcast input: `data[sum(index[d] * strides[d])]` is the value of cell `index`.
#[derive(Debug, Clone, Copy)]
pub struct GridInput<'a> {
    pub data: Values<'a>,
    pub strides: &'a [usize],
}

/// Cells handed to a worker at a time.
const CHUNK: usize = 4096;

/// The estimates of a grid, column by column.
#[derive(Debug, Clone, PartialEq)]
pub struct GridTable {
    /// `(N_OUTPUT_FIELDS, cells)` row-major: field `f` of cell `c` is `values[f * cells + c]`,
    /// so each field is one contiguous array. NaN in invalid cells.
    pub values: Vec<f64>,
    /// 0 for a valid cell, else the [`Invalid`](crate::memory::Invalid) code.
    pub reasons: Vec<u8>,
}

impl GridTable {
    /// Number of cells.
    pub fn cells(&self) -> usize {
        self.reasons.len()
    }

    /// One field of every cell.
    pub fn field(&self, index: usize) -> &[f64] {
        let cells = self.cells();
        &self.values[index * cells..(index + 1) * cells]
    }
}

/// Evaluate every cell of `shape`, the last axis fastest.
///
/// Invalid cells do not fail the grid: their values are NaN and their reason is set.
/// Errors are reserved for a bad spec or inconsistent buffers (a caller bug).
pub fn estimate_grid(
    spec: &ModelSpec,
    shape: &[usize],
    inputs: &[GridInput<'_>],
) -> Result<GridTable> {
    spec.validate()?;
    if inputs.len() != N_LAYOUT_FIELDS {
        return Err(Error::invalid(format!(
            "expected {N_LAYOUT_FIELDS} grid inputs, got {}",
            inputs.len()
        )));
    }
    let cells = shape
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
        .ok_or_else(|| Error::overflow("the grid has more cells than fit in memory"))?;
    let values = cells
        .checked_mul(N_OUTPUT_FIELDS)
        .ok_or_else(|| Error::overflow("the grid has more cells than fit in memory"))?;
    for (input, name) in inputs.iter().zip(LAYOUT_FIELDS) {
        if input.strides.len() != shape.len() {
            return Err(Error::invalid(format!(
                "{name}: {} strides for a {}-dimensional grid",
                input.strides.len(),
                shape.len()
            )));
        }
        if cells > 0 {
            let last = shape
                .iter()
                .zip(input.strides)
                .try_fold(0usize, |acc, (&n, &s)| {
                    (n - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
                });
            if last.is_none_or(|last| last >= input.data.len()) {
                return Err(Error::invalid(format!(
                    "{name}: strides reach past the end of its {} values",
                    input.data.len()
                )));
            }
        }
    }
    if values
        .checked_mul(std::mem::size_of::<f64>())
        .is_none_or(|bytes| bytes > isize::MAX as usize)
    {
        return Err(Error::overflow(format!(
            "a grid of {cells} cells needs {} MB for its results",
            values / 125_000
        )));
    }
    // The table is hundreds of MB for millions of cells: lazily mapped zeroed buffers
    // advised for huge pages keep the page faults from costing as much as the arithmetic.
    let mut table = GridTable {
        values: zeroed_vec!(f64, values),
        reasons: zeroed_vec!(u8, cells),
    };
    if cells == 0 {
        // Nothing to read: the inputs' buffers may be empty (checked only for cells > 0).
        return Ok(table);
    }
    let prepared = Prepared::new(spec);
    for_each_block(
        &prepared,
        &mut table,
        |estimator, first, columns, reasons| {
            let mut cursor = Cursor::new(shape, inputs, first);
            // The block's rows first, then each column in one pass: 10-25% faster on 1M
            // cells than storing every cell's 18 fields into 18 arrays as it goes.
            let mut rows = vec![[0.0f64; N_OUTPUT_FIELDS]; reasons.len()];
            for (reason, out) in reasons.iter_mut().zip(rows.iter_mut()) {
                let estimate = match cursor.bad_fields {
                    0 => estimator.estimate_checked_fields(&Layout::from_values(&cursor.values)),
                    bad => Err(field_rule(bad.trailing_zeros() as usize).1),
                };
                *out = match estimate {
                    Ok(breakdown) => breakdown.to_values(),
                    Err(invalid) => {
                        *reason = invalid.code();
                        [f64::NAN; N_OUTPUT_FIELDS]
                    }
                };
                cursor.advance();
            }
            for (f, column) in columns.iter_mut().enumerate() {
                for (value, row) in column.iter_mut().zip(&rows) {
                    *value = row[f];
                }
            }
        },
    );
    Ok(table)
}

/// Run `work(estimator, first_cell, columns, reasons)` over blocks of [`CHUNK`] cells in
/// parallel, each block holding its slice of every column, and each worker an
/// [`Estimator`] that it keeps from block to block (the terms that cells share are
/// computed once per worker).
fn for_each_block<F>(prepared: &Prepared, table: &mut GridTable, work: F)
where
    F: Fn(&mut Estimator<'_>, usize, &mut [&mut [f64]], &mut [u8]) + Sync,
{
    let cells = table.reasons.len();
    let mut columns: Vec<_> = table
        .values
        .chunks_mut(cells)
        .map(|column| column.chunks_mut(CHUNK))
        .collect();
    let blocks: Vec<(Vec<&mut [f64]>, &mut [u8])> = table
        .reasons
        .chunks_mut(CHUNK)
        .map(|reasons| {
            let block = columns.iter_mut().filter_map(Iterator::next).collect();
            (block, reasons)
        })
        .collect();
    blocks.into_par_iter().enumerate().for_each_init(
        || Estimator::new(prepared),
        |estimator, (b, (mut block, reasons))| work(estimator, b * CHUNK, &mut block, reasons),
    );
}

// `Cursor::bad_fields` has a bit per layout field.
const _: () = assert!(N_LAYOUT_FIELDS <= 32);

/// Walks the cells of a grid in order, keeping each input's offset, the cell's fields and
/// which of its fields fail their own check up to date. A step reads only the inputs that
/// move along the axes it moves (per axis, the inputs with a non-zero stride), so the
/// scalars of a sweep are read and checked once.
struct Cursor<'s, 'a> {
    shape: &'s [usize],
    inputs: &'s [GridInput<'a>],
    index: Vec<usize>,
    /// Per axis, the (field, stride) of each input that moves along it.
    moving: Vec<Vec<(usize, usize)>>,
    offsets: [usize; N_LAYOUT_FIELDS],
    /// Each field's [`FieldRule::bounds`].
    bounds: [(f64, f64, bool); N_LAYOUT_FIELDS],
    /// The cell's fields, in [`LAYOUT_FIELDS`] order: written by index, without a branch
    /// on the field.
    values: [f64; N_LAYOUT_FIELDS],
    /// Bit `f` is set while field `f`'s value fails its own check.
    bad_fields: u32,
}

impl<'s, 'a> Cursor<'s, 'a> {
    /// A cursor on cell `cell`.
    fn new(shape: &'s [usize], inputs: &'s [GridInput<'a>], cell: usize) -> Self {
        let moving = (0..shape.len())
            .map(|d| {
                let along = inputs
                    .iter()
                    .enumerate()
                    .filter(|(_, input)| input.strides[d] != 0);
                along
                    .map(|(field, input)| (field, input.strides[d]))
                    .collect()
            })
            .collect();
        let mut index = vec![0; shape.len()];
        let mut rest = cell;
        for d in (0..shape.len()).rev() {
            index[d] = rest % shape[d];
            rest /= shape[d];
        }
        let mut cursor = Cursor {
            shape,
            inputs,
            index,
            moving,
            offsets: [0; N_LAYOUT_FIELDS],
            bounds: std::array::from_fn(|field| field_rule(field).0.bounds()),
            values: [0.0; N_LAYOUT_FIELDS],
            bad_fields: 0,
        };
        for (field, input) in inputs.iter().enumerate() {
            cursor.offsets[field] = cursor
                .index
                .iter()
                .zip(input.strides)
                .map(|(i, s)| i * s)
                .sum();
            cursor.load(field);
        }
        cursor
    }

    /// Move to the next cell (last axis fastest).
    #[inline(always)]
    fn advance(&mut self) {
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            let wrapped = self.index[d] == self.shape[d];
            if wrapped {
                self.index[d] = 0;
            }
            for k in 0..self.moving[d].len() {
                let (field, stride) = self.moving[d][k];
                if wrapped {
                    self.offsets[field] -= stride * (self.shape[d] - 1);
                } else {
                    self.offsets[field] += stride;
                }
                // Past the last cell the offsets wrap to the first, which stays in bounds.
                self.load(field);
            }
            if !wrapped {
                return;
            }
        }
    }

    /// Read field `field`'s value at its current offset, and check it.
    #[inline(always)]
    fn load(&mut self, field: usize) {
        let value = self.inputs[field].data.get(self.offsets[field]);
        self.values[field] = value;
        let bit = 1u32 << field;
        let (low, high, whole) = self.bounds[field];
        let fine = if whole {
            is_whole_in(value, low, high)
        } else {
            (low..=high).contains(&value)
        };
        if fine {
            self.bad_fields &= !bit;
        } else {
            self.bad_fields |= bit;
        }
    }
}

/// Every pipeline stage of a single configuration (the spec is validated first): the
/// stages' breakdowns, or why the configuration is invalid.
pub fn estimate_all_stages(
    spec: &ModelSpec,
    layout: &Layout,
) -> Result<std::result::Result<Vec<Breakdown>, Invalid>> {
    spec.validate()?;
    Ok(estimate_stages(&Prepared::new(spec), layout))
}

/// Estimate a single configuration (a grid of one cell).
pub fn estimate_one(
    spec: &ModelSpec,
    layout: &Layout,
) -> Result<std::result::Result<Breakdown, Invalid>> {
    spec.validate()?;
    Ok(estimate(&Prepared::new(spec), layout))
}

/// The largest number of tokens in one micro-batch (one packed row: `micro_batch = 1`,
/// `seq_len = tokens`) whose estimate fits in `gpu_memory` bytes, a multiple of
/// `multiple_of` and, with context parallelism, of `2 * cp`; 0 when not even that many
/// fit. The layout's `seq_len` and `micro_batch` are ignored.
///
/// `Err((reason, seq_len))`: the smallest row tried, `seq_len` tokens, is invalid. A
/// longer row that overflows is one that does not fit.
pub fn max_micro_batch_tokens(
    spec: &ModelSpec,
    layout: &Layout,
    gpu_memory: f64,
    multiple_of: u64,
) -> Result<std::result::Result<u64, (Invalid, u64)>> {
    spec.validate()?;
    if !(gpu_memory.is_finite() && gpu_memory > 0.0) {
        return Err(Error::invalid(format!(
            "gpu_memory must be a positive number of bytes, got {gpu_memory}"
        )));
    }
    if multiple_of == 0 {
        return Err(Error::invalid("multiple_of must be at least 1, got 0"));
    }
    let mut step = multiple_of;
    if field_rule(5).0.accepts(layout.cp) && layout.cp > 1.0 {
        let pair = 2 * layout.cp as u64;
        step = step
            .checked_mul(pair / gcd(step, pair))
            .ok_or_else(|| Error::overflow("multiple_of * 2 * cp does not fit in 64 bits"))?;
    }
    let prepared = Prepared::new(spec);
    let mut probe = Layout {
        micro_batch: 1.0,
        ..*layout
    };
    let mut fits = |units: u64| {
        probe.seq_len = (units * step) as f64;
        estimate(&prepared, &probe).map(|breakdown| breakdown.total <= gpu_memory)
    };
    match fits(1) {
        Err(reason) => return Ok(Err((reason, step))),
        Ok(false) => return Ok(Ok(0)),
        Ok(true) => {}
    }
    // Double until a row does not fit (or is past 2^40 steps), then bisect.
    let (mut low, mut high) = (1u64, 2u64);
    while fits(high).unwrap_or(false) {
        low = high;
        high *= 2;
        if high > 1 << 40 {
            return Ok(Ok(low * step));
        }
    }
    while high - low > 1 {
        let middle = low + (high - low) / 2;
        if fits(middle).unwrap_or(false) {
            low = middle;
        } else {
            high = middle;
        }
    }
    Ok(Ok(low * step))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
