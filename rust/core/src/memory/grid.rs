//! Broadcast evaluation of many configurations at once.
//!
//! Each layout field arrives as a compact buffer plus element strides over the common
//! output shape (a stride of 0 repeats a value along that axis, as numpy broadcasting
//! does), so a grid of millions of cells never materializes its broadcast inputs.

use std::sync::OnceLock;

use rayon::prelude::*;

use crate::buffers::zeroed_vec;
use crate::error::{Error, Result};
use crate::memory::estimate::{
    check_field, clear_failing, estimate, estimate_stages, estimate_with_terms, field_rule,
    Breakdown, Estimator, FieldRule, Prepared, Terms, KEY_LEN_FIELDS, LIST_KEY_WORDS,
    N_OUTPUT_FIELDS, TERMS_FIELDS,
};
use crate::memory::layout::{Invalid, Layout, INVALID_REASONS, LAYOUT_FIELDS, N_LAYOUT_FIELDS};
use crate::memory::names::NameTable;
use crate::memory::spec::ModelSpec;

/// The values of one input, as the caller has them: floats, or integers (64- or 32-bit),
/// booleans or names read as floats where a cell needs them (a list of a million
/// configurations is mostly integer, boolean and string columns, which are then never
/// copied).
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    F64(&'a [f64]),
    I64(&'a [i64]),
    I32(&'a [i32]),
    Bool(&'a [bool]),
    /// Fixed-width strings (as numpy stores them), read as their codes in the table (NaN,
    /// an invalid value, for a string that names nothing).
    Names(&'a [u32], &'a NameTable),
}

impl Values<'_> {
    pub fn len(&self) -> usize {
        match self {
            Values::F64(values) => values.len(),
            Values::I64(values) => values.len(),
            Values::I32(values) => values.len(),
            Values::Bool(values) => values.len(),
            Values::Names(text, names) => text.len() / names.width(),
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
            Values::Names(text, names) => {
                let width = names.width();
                names.code(&text[index * width..(index + 1) * width])
            }
        }
    }

    /// Values `first..first + out.len()` as floats; the caller has checked the bounds.
    #[inline(always)]
    pub fn copy_to(&self, first: usize, out: &mut [f64]) {
        let range = first..first + out.len();
        match self {
            Values::F64(values) => out.copy_from_slice(&values[range]),
            Values::I64(values) => widen(&values[range], out, |x| x as f64),
            Values::I32(values) => widen(&values[range], out, f64::from),
            Values::Bool(values) => widen(&values[range], out, |x| f64::from(u8::from(x))),
            Values::Names(text, names) => {
                let width = names.width();
                names.codes_into(&text[range.start * width..range.end * width], out);
            }
        }
    }

    /// [`Values::copy_to`], clearing `ok[i]` where value `i` breaks `rule`.
    #[inline(always)]
    pub(crate) fn copy_checked(
        &self,
        first: usize,
        out: &mut [f64],
        rule: FieldRule,
        ok: &mut [bool],
    ) {
        self.copy_to(first, out);
        if let Values::I64(_) | Values::I32(_) = self {
            // Whole numbers: the rule is the range.
            let (low, high) = rule.range();
            clear_failing(out, ok, |x| (x >= low) & (x <= high));
        } else {
            rule.check_all(out, ok);
        }
    }

    /// Ask for values `first..first + n` (those that exist) to be loaded into the cache:
    /// a hint. Names are asked for as they are matched ([`NameTable::codes_into`]).
    #[inline(always)]
    pub(crate) fn prefetch(&self, first: usize, n: usize) {
        fn lines<T>(values: &[T], first: usize, n: usize) {
            let Some(values) = values.get(first..) else {
                return;
            };
            let start = values.as_ptr().cast::<u8>();
            let bytes = std::mem::size_of_val(&values[..n.min(values.len())]);
            for offset in (0..bytes).step_by(64) {
                crate::prefetch::prefetch(start.wrapping_add(offset));
            }
        }
        match self {
            Values::F64(values) => lines(values, first, n),
            Values::I64(values) => lines(values, first, n),
            Values::I32(values) => lines(values, first, n),
            Values::Bool(values) => lines(values, first, n),
            Values::Names(..) => {}
        }
    }

    /// Whether some value is `x`.
    pub fn contains(&self, x: f64) -> bool {
        let mut values = [0.0; 1024];
        (0..self.len()).step_by(values.len()).any(|first| {
            let values = &mut values[..(self.len() - first).min(1024)];
            self.copy_to(first, values);
            values.contains(&x)
        })
    }
}

/// `out[i] = to_float(values[i])`: one conversion loop, which the compiler vectorizes for
/// each kind of value.
#[inline(always)]
fn widen<T: Copy>(values: &[T], out: &mut [f64], to_float: impl Fn(T) -> f64) {
    for (o, &x) in out.iter_mut().zip(values) {
        *o = to_float(x);
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
    let is_list = shape.len() == 1 && inputs.iter().all(|input| input.strides[0] <= 1);
    if is_list {
        estimate_list(&prepared, inputs, &mut table);
    } else {
        estimate_broadcast(&prepared, shape, inputs, &mut table);
    }
    Ok(table)
}

/// Store cell `i`'s estimate (or NaN and its reason) in the block's columns. Inlined, so
/// that the breakdown goes from registers to the columns rather than through a copy.
#[inline(always)]
fn store(
    columns: &mut [&mut [f64]],
    reason: &mut u8,
    i: usize,
    estimate: std::result::Result<Breakdown, Invalid>,
) {
    let row = match estimate {
        Ok(breakdown) => breakdown.to_values(),
        Err(invalid) => {
            *reason = invalid.code();
            [f64::NAN; N_OUTPUT_FIELDS]
        }
    };
    for (column, value) in columns.iter_mut().zip(row) {
        column[i] = value;
    }
}

/// A grid over a broadcast of inputs, walked with a [`Cursor`].
fn estimate_broadcast(
    prepared: &Prepared,
    shape: &[usize],
    inputs: &[GridInput<'_>],
    table: &mut GridTable,
) {
    // The cursor reads a value whenever its cell moves along the value's axis: names are
    // matched once per value here, not once per cell.
    let codes: Vec<Option<Vec<f64>>> = inputs
        .iter()
        .map(|input| match input.data {
            Values::Names(..) => {
                let mut codes = vec![0.0; input.data.len()];
                input.data.copy_to(0, &mut codes);
                Some(codes)
            }
            _ => None,
        })
        .collect();
    let inputs: Vec<GridInput<'_>> = inputs
        .iter()
        .zip(&codes)
        .map(|(input, codes)| GridInput {
            data: codes.as_deref().map_or(input.data, Values::F64),
            strides: input.strides,
        })
        .collect();
    let inputs = &inputs[..];
    // Each field's own check depends on its value alone: run it once per input value
    // instead of once per cell (it was a fifth of a grid's time).
    let field_reasons: Vec<Vec<u8>> = inputs
        .iter()
        .enumerate()
        .map(|(field, input)| {
            (0..input.data.len())
                .map(|i| {
                    check_field(field, input.data.get(i))
                        .err()
                        .map_or(0, Invalid::code)
                })
                .collect()
        })
        .collect();
    let terms_table = TermsTable::new(shape, inputs);
    let no_radix = vec![0; shape.len()];
    let radix = terms_table.as_ref().map_or(&no_radix, |t| &t.radix);
    for_each_block(prepared, table, |estimator, first, columns, reasons| {
        // One loop for both ways of finding a cell's terms: unlike a list's (see
        // `estimate_list`), a loop per way ran 4% more instructions here.
        let mut cursor = Cursor::new(shape, inputs, &field_reasons, radix);
        for (i, reason) in reasons.iter_mut().enumerate() {
            cursor.seek(first + i);
            let estimate = match (cursor.field_reason(), &terms_table) {
                (0, Some(terms_table)) => {
                    let layout = cursor.layout();
                    let terms = terms_table.entries[cursor.terms_index]
                        .get_or_init(|| Terms::of(prepared, layout));
                    estimate_with_terms(prepared, layout, terms)
                }
                (0, None) => estimator.estimate_checked_fields(cursor.layout()),
                (code, _) => Err(INVALID_REASONS[usize::from(code) - 1]),
            };
            store(columns, reason, i, estimate);
        }
    });
}

/// Entries of a [`TermsTable`] at most: past this, the cells are looked up by key.
const MAX_TABLED_TERMS: usize = 1 << 12;

/// The [`Terms`] of a broadcast grid's cells by the cell's indices along the axes that the
/// fields the terms depend on vary along: cells with the same indices on those axes share
/// their terms, computed by the first cell that needs them. A [`Cursor`] keeps the index
/// of its cell's entry as it moves, so a cell finds its terms without reading the fields.
struct TermsTable {
    /// Per axis, how far the entry index moves when the cell's index on that axis grows
    /// by one (0 on axes the terms do not depend on).
    radix: Vec<usize>,
    entries: Vec<OnceLock<Terms>>,
}

impl TermsTable {
    /// `None` when the terms vary over more than [`MAX_TABLED_TERMS`] combinations.
    fn new(shape: &[usize], inputs: &[GridInput<'_>]) -> Option<Self> {
        let depends = terms_fields(inputs);
        let mut radix = vec![0; shape.len()];
        let mut entries = 1usize;
        for d in (0..shape.len()).rev() {
            let along = inputs
                .iter()
                .zip(depends)
                .any(|(input, depends)| input.strides[d] != 0 && depends);
            if along {
                radix[d] = entries;
                entries = entries
                    .checked_mul(shape[d])
                    .filter(|&n| n <= MAX_TABLED_TERMS)?;
            }
        }
        Some(TermsTable {
            radix,
            entries: (0..entries).map(|_| OnceLock::new()).collect(),
        })
    }
}

/// Which fields the [`Terms`] of a grid's cells depend on: those of [`TERMS_FIELDS`], and
/// `seq_len` where some cell's attention is eager or its activation model `korthikanti`.
fn terms_fields(inputs: &[GridInput<'_>]) -> [bool; N_LAYOUT_FIELDS] {
    let (seq_len, switches) = KEY_LEN_FIELDS;
    let key_len_used = switches
        .iter()
        .any(|&field| inputs[field].data.contains(1.0));
    std::array::from_fn(|field| TERMS_FIELDS.contains(&field) || (key_len_used && field == seq_len))
}

/// A list of independent configurations: every input is a scalar or a column with one
/// value per cell. A cell reads each column once, checking the value as it sets it; only a
/// cell with a bad value looks for the first bad field in field order. No cursor
/// bookkeeping, no per-value tables.
fn estimate_list(prepared: &Prepared, inputs: &[GridInput<'_>], table: &mut GridTable) {
    let depends = terms_fields(inputs);
    let mut scalars = Layout::default();
    let mut scalars_ok = true;
    // Per column: its field, its rule, its values, and the word of the cell's list key it
    // sets (`LIST_KEY_WORDS` or more: none, for a column the terms do not depend on, and
    // past the key's words when more columns than it holds vary): cells of a list that
    // agree on these columns agree on every field the terms depend on, since the others
    // are scalars.
    let mut columns_of: Vec<(usize, FieldRule, Values<'_>, usize)> = Vec::new();
    let mut key_words = 0;
    for (field, input) in inputs.iter().enumerate() {
        let (rule, _) = field_rule(field);
        if input.strides[0] == 0 {
            scalars.set(field, input.data.get(0));
            scalars_ok &= rule.accepts(input.data.get(0));
        } else {
            let word = if depends[field] {
                key_words += 1;
                key_words - 1
            } else {
                LIST_KEY_WORDS
            };
            columns_of.push((field, rule, input.data, word));
        }
    }
    let list_key = key_words <= LIST_KEY_WORDS;
    for_each_block(prepared, table, |estimator, first, columns, reasons| {
        // The cells of a block in batches, each gathered column by column: a column's
        // loop reads, converts and checks one kind of value into one field, where a cell
        // by cell walk would switch kind, rule and field at every value.
        let mut layouts = [scalars; LIST_BATCH];
        let mut ok = [true; LIST_BATCH];
        let mut keys = [[0u64; LIST_KEY_WORDS]; LIST_BATCH];
        let mut values = [0.0f64; LIST_BATCH];
        for start in (0..reasons.len()).step_by(LIST_BATCH) {
            let n = LIST_BATCH.min(reasons.len() - start);
            ok[..n].fill(scalars_ok);
            // The hardware's prefetching alone leaves the first reads of each batch waiting
            // on memory (a batch reads a few cache lines from each of up to nine columns).
            for &(_, _, data, _) in &columns_of {
                data.prefetch(first + start + PREFETCH_BATCHES * LIST_BATCH, LIST_BATCH);
            }
            for &(field, rule, data, word) in &columns_of {
                let values = &mut values[..n];
                data.copy_checked(first + start, values, rule, &mut ok[..n]);
                Layout::set_all(&mut layouts[..n], field, values);
                if word < LIST_KEY_WORDS {
                    for (key, x) in keys[..n].iter_mut().zip(values.iter()) {
                        key[word] = x.to_bits();
                    }
                }
            }
            let (layouts, ok) = (&layouts[..n], &ok[..n]);
            let reasons = &mut reasons[start..start + n];
            // One loop for each way of finding a cell's terms (the choice is the same for
            // every cell): one loop that inlined the estimate twice, once per way, ran 5%
            // more instructions (callgrind, a list of a million cells: 1,285M against
            // 1,219M), which made a list slower than a broadcast grid of the same cells.
            if list_key {
                let keys = &keys;
                estimate_batch(layouts, ok, columns, start, reasons, |j, layout| {
                    estimator.estimate_list_cell(layout, keys[j])
                });
            } else {
                estimate_batch(layouts, ok, columns, start, reasons, |_, layout| {
                    estimator.estimate_checked_fields(layout)
                });
            }
        }
    });
}

/// Store the estimates of a list's gathered cells `start..start + layouts.len()` of a
/// block: `estimate(j, layout)` where cell `j`'s fields each passed their checks
/// (`ok[j]`), else the reason of the first that failed.
#[inline(always)]
fn estimate_batch(
    layouts: &[Layout],
    ok: &[bool],
    columns: &mut [&mut [f64]],
    start: usize,
    reasons: &mut [u8],
    mut estimate: impl FnMut(usize, &Layout) -> std::result::Result<Breakdown, Invalid>,
) {
    for (j, ((layout, &ok), reason)) in layouts.iter().zip(ok).zip(reasons).enumerate() {
        let estimate = if ok {
            estimate(j, layout)
        } else {
            Err(first_bad_field(layout))
        };
        store(columns, reason, start + j, estimate);
    }
}

/// How many batches ahead a list's columns are asked into the cache.
const PREFETCH_BATCHES: usize = 4;

/// Cells of a list gathered at a time: their layouts stay in the core's first-level cache.
const LIST_BATCH: usize = 32;

/// The reason of the first field, in field order, that fails its own check.
fn first_bad_field(layout: &Layout) -> Invalid {
    layout
        .to_values()
        .iter()
        .enumerate()
        .find_map(|(field, &x)| check_field(field, x).err())
        .unwrap_or(Invalid::Bytes)
}

/// Run `work(estimator, first_cell, columns, reasons)` over blocks of [`CHUNK`] cells in
/// parallel, each block holding its slice of every column, and each worker an
/// [`Estimator`] that it keeps from block to block.
fn for_each_block<F>(prepared: &Prepared, table: &mut GridTable, work: F)
where
    F: Fn(&mut Estimator<'_>, usize, &mut [&mut [f64]], &mut [u8]) + Sync,
{
    let cells = table.reasons.len();
    if cells == 0 {
        return;
    }
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

/// Walks the cells of a grid, keeping each input's offset and value up to date.
///
/// Most inputs of a sweep are scalars and most steps move along the last axis only, so a
/// step touches just the inputs that vary along the axes it moves: per axis, the list of
/// (input, stride) pairs with a non-zero stride.
struct Cursor<'s, 'a> {
    shape: &'s [usize],
    inputs: &'s [GridInput<'a>],
    /// [`check_field`]'s code for each value of each input (0: fine).
    field_reasons: &'s [Vec<u8>],
    index: Vec<usize>,
    moving: Vec<Vec<(usize, usize)>>,
    offsets: [usize; N_LAYOUT_FIELDS],
    /// The current cell's configuration, updated a field at a time.
    layout: Layout,
    /// Bit `f` is set while field `f`'s value fails its own check.
    bad_fields: u32,
    /// The flat cell the cursor is on (`usize::MAX` before the first seek).
    cell: usize,
    /// Per axis, the step of [`Cursor::terms_index`] (a [`TermsTable`]'s radix).
    terms_radix: &'s [usize],
    /// The cell's entry in the grid's [`TermsTable`].
    terms_index: usize,
}

impl<'s, 'a> Cursor<'s, 'a> {
    fn new(
        shape: &'s [usize],
        inputs: &'s [GridInput<'a>],
        field_reasons: &'s [Vec<u8>],
        terms_radix: &'s [usize],
    ) -> Self {
        let moving = (0..shape.len())
            .map(|d| {
                inputs
                    .iter()
                    .enumerate()
                    .filter(|(_, input)| input.strides[d] != 0)
                    .map(|(field, input)| (field, input.strides[d]))
                    .collect()
            })
            .collect();
        Cursor {
            shape,
            inputs,
            field_reasons,
            index: vec![0; shape.len()],
            moving,
            offsets: [0; N_LAYOUT_FIELDS],
            layout: Layout::default(),
            bad_fields: 0,
            cell: usize::MAX,
            terms_radix,
            terms_index: 0,
        }
    }

    /// Move to `cell`: one step forward when it is the next cell, else from scratch.
    fn seek(&mut self, cell: usize) {
        if self.cell != usize::MAX && cell == self.cell + 1 {
            self.advance();
        } else {
            let mut rest = cell;
            for d in (0..self.shape.len()).rev() {
                self.index[d] = rest % self.shape[d];
                rest /= self.shape[d];
            }
            for (field, input) in self.inputs.iter().enumerate() {
                let offset = self
                    .index
                    .iter()
                    .zip(input.strides)
                    .map(|(i, s)| i * s)
                    .sum();
                self.offsets[field] = offset;
                self.load(field);
            }
            self.terms_index = self
                .index
                .iter()
                .zip(self.terms_radix)
                .map(|(i, r)| i * r)
                .sum();
        }
        self.cell = cell;
    }

    /// Advance the multi-index (last axis fastest) and the inputs that move with it.
    fn advance(&mut self) {
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            let wrapped = self.index[d] == self.shape[d];
            if wrapped {
                self.index[d] = 0;
                self.terms_index -= self.terms_radix[d] * (self.shape[d] - 1);
            } else {
                self.terms_index += self.terms_radix[d];
            }
            for k in 0..self.moving[d].len() {
                let (field, stride) = self.moving[d][k];
                if wrapped {
                    self.offsets[field] -= stride * (self.shape[d] - 1);
                } else {
                    self.offsets[field] += stride;
                }
                self.load(field);
            }
            if !wrapped {
                return;
            }
        }
    }

    /// Read field `field`'s value (and its check) at its current offset.
    fn load(&mut self, field: usize) {
        let offset = self.offsets[field];
        self.layout.set(field, self.inputs[field].data.get(offset));
        let bit = 1u32 << field;
        if self.field_reasons[field][offset] == 0 {
            self.bad_fields &= !bit;
        } else {
            self.bad_fields |= bit;
        }
    }

    /// The code of the first field (in field order) whose value fails its own check; 0
    /// when every field passes.
    fn field_reason(&self) -> u8 {
        if self.bad_fields == 0 {
            0
        } else {
            let field = self.bad_fields.trailing_zeros() as usize;
            self.field_reasons[field][self.offsets[field]]
        }
    }

    fn layout(&self) -> &Layout {
        &self.layout
    }
}

/// Every pipeline stage of a single configuration (the spec is validated first): the
/// stages' breakdowns, or why the configuration is invalid.
pub fn estimate_all_stages(
    spec: &ModelSpec,
    layout: &Layout,
) -> Result<std::result::Result<Vec<Breakdown>, crate::memory::layout::Invalid>> {
    spec.validate()?;
    Ok(estimate_stages(&Prepared::new(spec), layout))
}

/// Estimate a single configuration (a grid of one cell).
pub fn estimate_one(
    spec: &ModelSpec,
    layout: &Layout,
) -> Result<std::result::Result<Breakdown, crate::memory::layout::Invalid>> {
    spec.validate()?;
    Ok(estimate(&Prepared::new(spec), layout))
}
