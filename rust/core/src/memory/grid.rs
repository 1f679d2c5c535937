//! Broadcast evaluation of many configurations at once.
//!
//! Each layout field arrives as a compact buffer plus element strides over the common
//! output shape (a stride of 0 repeats a value along that axis, as numpy broadcasting
//! does), so a grid of millions of cells never materializes its broadcast inputs.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::memory::estimate::{estimate, Breakdown, Prepared, N_OUTPUT_FIELDS};
use crate::memory::layout::{Layout, LAYOUT_FIELDS, N_LAYOUT_FIELDS};
use crate::memory::spec::ModelSpec;

/// One broadcast input: `data[sum(index[d] * strides[d])]` is the value of cell `index`.
#[derive(Debug, Clone, Copy)]
pub struct GridInput<'a> {
    pub data: &'a [f64],
    pub strides: &'a [usize],
}

/// Cells handed to a worker at a time.
const CHUNK: usize = 4096;

/// Evaluate every cell of `shape`; returns a row-major `(cells, N_OUTPUT_FIELDS)` table.
///
/// Invalid cells do not fail the grid: their row is NaN but for the `reason` column.
/// Errors are reserved for a bad spec or inconsistent buffers (a caller bug).
pub fn estimate_grid(
    spec: &ModelSpec,
    shape: &[usize],
    inputs: &[GridInput<'_>],
) -> Result<Vec<f64>> {
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
    let prepared = Prepared::new(spec);
    let mut rows: Vec<[f64; N_OUTPUT_FIELDS]> = Vec::new();
    rows.try_reserve_exact(cells).map_err(|_| {
        Error::overflow(format!(
            "a grid of {cells} cells needs {} MB for its results",
            values / 125_000
        ))
    })?;
    // The result table is hundreds of MB for millions of cells: page faults on 4 KiB pages
    // would cost as much as the arithmetic.
    crate::buffers::advise_huge_pages(rows.spare_capacity_mut());
    // Indexed collect writes each row once, straight into the reserved buffer.
    (0..cells)
        .into_par_iter()
        .with_min_len(CHUNK)
        .map_init(
            || Cursor::new(shape, inputs),
            |cursor, cell| {
                cursor.seek(cell);
                let layout = Layout::from_values(&cursor.values());
                match estimate(&prepared, &layout) {
                    Ok(breakdown) => breakdown.to_values(),
                    Err(reason) => Breakdown::invalid_values(reason),
                }
            },
        )
        .collect_into_vec(&mut rows);
    Ok(rows.into_flattened())
}

/// Walks the cells of a grid, keeping each input's offset up to date.
struct Cursor<'s, 'a> {
    shape: &'s [usize],
    inputs: &'s [GridInput<'a>],
    index: Vec<usize>,
    offsets: [usize; N_LAYOUT_FIELDS],
    /// The flat cell the cursor is on (`usize::MAX` before the first seek).
    cell: usize,
}

impl<'s, 'a> Cursor<'s, 'a> {
    fn new(shape: &'s [usize], inputs: &'s [GridInput<'a>]) -> Self {
        Cursor {
            shape,
            inputs,
            index: vec![0; shape.len()],
            offsets: [0; N_LAYOUT_FIELDS],
            cell: usize::MAX,
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
            for (offset, input) in self.offsets.iter_mut().zip(self.inputs) {
                *offset = self
                    .index
                    .iter()
                    .zip(input.strides)
                    .map(|(i, s)| i * s)
                    .sum();
            }
        }
        self.cell = cell;
    }

    /// Advance the multi-index (last axis fastest) and every input's offset with it.
    fn advance(&mut self) {
        for d in (0..self.shape.len()).rev() {
            self.index[d] += 1;
            for (offset, input) in self.offsets.iter_mut().zip(self.inputs) {
                *offset += input.strides[d];
            }
            if self.index[d] < self.shape[d] {
                return;
            }
            for (offset, input) in self.offsets.iter_mut().zip(self.inputs) {
                *offset -= input.strides[d] * self.shape[d];
            }
            self.index[d] = 0;
        }
    }

    fn values(&self) -> [f64; N_LAYOUT_FIELDS] {
        let mut values = [0.0; N_LAYOUT_FIELDS];
        for ((value, input), &offset) in values.iter_mut().zip(self.inputs).zip(&self.offsets) {
            *value = input.data[offset];
        }
        values
    }
}

/// Estimate a single configuration (a grid of one cell).
pub fn estimate_one(
    spec: &ModelSpec,
    layout: &Layout,
) -> Result<std::result::Result<Breakdown, crate::memory::layout::Invalid>> {
    spec.validate()?;
    Ok(estimate(&Prepared::new(spec), layout))
}
