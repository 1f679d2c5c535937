//! The packing entry points for atomic groups and for several budgets at once (see
//! [`units`](super::units) for how groups become units).

use super::columns;
use super::options::{Oversize, PackOptions, MAX_TOKENS_LIMIT};
use super::segments::Length;
use super::units::{self, CostInput, Units};
use super::{Bins, Packing, PackingKind};
use crate::error::{Error, Result};

/// The most cost columns [`pack_costs`] takes.
pub const MAX_COST_COLUMNS: usize = 8;

/// The units of `lengths` grouped by `groups` (runs of equal ids).
fn grouped_units<L: Length>(
    lengths: &[L],
    groups: &[i64],
    options: &PackOptions,
    padded: bool,
) -> Result<Units> {
    if groups.len() != lengths.len() {
        return Err(Error::invalid(format!(
            "groups has {} ids for {} sequences; pass one group id per sequence",
            groups.len(),
            lengths.len()
        )));
    }
    units::check_policy(options, "groups")?;
    let runs = units::runs(groups)?;
    let input = CostInput::Lengths {
        n: lengths.len(),
        length: |i: usize, _| lengths[i].to_i64(),
    };
    units::gather(&input, Some(&runs), Some(groups), options, padded)
}

/// Pack `lengths` into bins of at most `options.max_tokens`, each group of sequences
/// sharing an id in `groups` placed whole, consecutively and in input order, in one bin.
///
/// Groups are runs of equal ids (any ids; an id that returns after others is refused). A
/// group costs the sum of its members' costs and must fit the budget (and `max_seqs`): if
/// not, `oversize` refuses it ("error") or leaves it out ("drop"); "split" and "truncate"
/// are refused. With one budget the groups are packed by `options.algorithm` like
/// sequences; with `max_seqs`, the count of members is a second budget and bins are filled
/// as [`pack_costs`] fills them.
pub fn pack_grouped<L: Length>(
    lengths: &[L],
    groups: &[i64],
    options: &PackOptions,
) -> Result<Packing> {
    let units = grouped_units(lengths, groups, options, false)?;
    let assign = || {
        if units.columns() == 1 {
            // One budget: the groups are packed as sequences of their cost.
            let unit_options = PackOptions {
                pad_to_multiple_of: 1,
                oversize: Oversize::Error,
                ..options.clone()
            };
            super::bins_by_index(&units.costs, &unit_options)
        } else {
            Ok(columns::first_fit_columns(&units))
        }
    };
    let (assigned, outputs) = super::with_outputs((units.n_members(), false), assign);
    let (bin_of, totals) = assigned?;
    let length = |i: usize| lengths[i].to_i64();
    Ok(units::lay_out(
        &units, &bin_of, totals, length, options, None, outputs,
    ))
}

/// Padded batching with groups: a batch of `n` sequences costs `n x` its longest cost, and
/// each group is placed whole in one batch. Groups are sorted by their longest member's
/// cost (decreasing, ties by input order) and cut into consecutive batches.
pub fn batch_padded_grouped<L: Length>(
    lengths: &[L],
    groups: &[i64],
    options: &PackOptions,
) -> Result<Packing> {
    let units = grouped_units(lengths, groups, options, true)?;
    let longest: Vec<u64> = (0..units.len())
        .map(|u| units.tokens(u) / units.members(u).len() as u64)
        .collect();
    let ((bin_of, totals, batch_cost), outputs) =
        super::with_outputs((units.n_members(), false), || {
            columns::padded_units(&units, &longest, options.max_tokens, options.max_seqs)
        });
    let length = |i: usize| lengths[i].to_i64();
    Ok(units::lay_out(
        &units,
        &bin_of,
        totals,
        length,
        options,
        Some(batch_cost),
        outputs,
    ))
}

/// Options of [`pack_costs`] besides the costs and budgets, as a caller passes them.
#[derive(Debug, Clone, Copy)]
pub struct CostOptions<'a> {
    /// At most this many sequences in one bin.
    pub max_seqs: Option<i64>,
    /// Column 0 of each sequence is rounded up to a multiple of this.
    pub pad_to_multiple_of: i64,
    /// `"error"` or `"drop"`.
    pub oversize: &'a str,
}

/// Pack sequences under several budgets at once: `costs` holds `columns` costs per
/// sequence (row-major), `max_costs` one budget per column, and every bin stays within
/// every budget. Column 0 is the sequence's tokens: it gives the segments' lengths, is
/// rounded up to `pad_to_multiple_of`, and its budget is the packing's `max_tokens`.
///
/// Sequences (or groups, with `groups`) are offered by decreasing size, their largest
/// share of a budget, and each goes to the first bin where every column fits. The lower
/// bound of the result is the largest over the columns (and `max_seqs`).
pub fn pack_costs(
    costs: &[i64],
    columns: usize,
    max_costs: &[i64],
    groups: Option<&[i64]>,
    options: CostOptions<'_>,
) -> Result<Bins> {
    if !(1..=MAX_COST_COLUMNS).contains(&columns) {
        return Err(Error::invalid(format!(
            "costs must have 1 to {MAX_COST_COLUMNS} columns, got {columns}"
        )));
    }
    if max_costs.len() != columns {
        return Err(Error::invalid(format!(
            "costs has {columns} columns but max_costs has {} budgets; pass one budget per column",
            max_costs.len()
        )));
    }
    let mut budgets = Vec::with_capacity(columns);
    for (c, &budget) in max_costs.iter().enumerate() {
        if budget <= 0 || budget as u64 > MAX_TOKENS_LIMIT {
            return Err(Error::invalid(format!(
                "max_costs[{c}] = {budget}: every budget must be between 1 and {MAX_TOKENS_LIMIT}"
            )));
        }
        budgets.push(budget as u64);
    }
    let n = costs.len() / columns;
    if let Some(ids) = groups {
        if ids.len() != n {
            return Err(Error::invalid(format!(
                "groups has {} ids for {n} sequences; pass one group id per row of costs",
                ids.len()
            )));
        }
    }
    let pack_options = PackOptions::new(
        max_costs[0],
        options.max_seqs,
        options.pad_to_multiple_of,
        options.oversize,
        "ffd",
        0,
    )?;
    units::check_policy(&pack_options, "several budgets")?;
    let runs = groups.map(units::runs).transpose()?;
    let input = CostInput::Matrix {
        n,
        cost: |i: usize, c: usize| costs[i * columns + c],
        budgets: &budgets,
    };
    let units = units::gather(&input, runs.as_deref(), groups, &pack_options, false)?;
    let ((bin_of, totals), outputs) = super::with_outputs((units.n_members(), false), || {
        columns::first_fit_columns(&units)
    });
    let length = |i: usize| costs[i * columns];
    let packing = units::lay_out(
        &units,
        &bin_of,
        totals,
        length,
        &pack_options,
        None,
        outputs,
    );
    let by_column = (0..units.columns())
        .map(|c| {
            let total: u64 = (0..units.len()).map(|u| units.cost(u)[c]).sum();
            total.div_ceil(units.budgets[c])
        })
        .max()
        .unwrap_or(0);
    let mut bins = Bins::new(packing, &pack_options, n, PackingKind::Packed);
    bins.lower_bound = bins.lower_bound.max(by_column);
    Ok(match groups {
        Some(ids) => bins.with_group_ids(ids),
        None => bins,
    })
}
