//! Atomic groups and cost columns: what is packed when a bin must keep sequences together
//! or stay within several budgets.
//!
//! A *group* is a run of consecutive input sequences sharing an id. It is packed as one
//! *unit* whose cost in each column is the sum of its members' costs, then laid out member
//! by member, in input order, so the CSR layout of the result is that of any packing.
//! Without ids every sequence is a unit of one.

use rayon::prelude::*;

use super::assign::BinTotals;
use super::layout;
use super::options::{Oversize, PackOptions, MAX_TOKENS_LIMIT};
use super::order::SegmentBins;
use super::segments::{PolicyCounts, Segments};
use super::Packing;
use crate::buffers::with_capacity_huge;
use crate::error::{Error, Result};

/// The runs of equal ids in `groups`: the first sequence of each run, then `groups.len()`.
///
/// Refuses an id that comes back after other ids, naming the last sequence of its first
/// run and the first of the run where it returns (the earliest such return in the input).
pub fn runs(groups: &[i64]) -> Result<Vec<u32>> {
    let n = groups.len();
    check_count(n)?;
    // Room for a run per sequence: only the pages the runs fill are ever mapped.
    let mut starts: Vec<u32> = with_capacity_huge(n + 1);
    if n > 0 {
        starts.push(0);
    }
    for (i, pair) in groups.windows(2).enumerate() {
        if pair[0] != pair[1] {
            starts.push(i as u32 + 1);
        }
    }
    starts.push(n as u32);
    check_distinct(groups, &starts)?;
    Ok(starts)
}

/// Refuse more sequences than the `u32` indices of the packing hold.
fn check_count(n: usize) -> Result<()> {
    if n >= u32::MAX as usize {
        return Err(Error::overflow(format!(
            "{n} sequences is more than the supported {}",
            u32::MAX - 1
        )));
    }
    Ok(())
}

/// Every run of `starts` has its own id.
fn check_distinct(groups: &[i64], starts: &[u32]) -> Result<()> {
    let n_runs = starts.len() - 1;
    let id = |run: usize| groups[starts[run] as usize];
    // Ids that only rise (or only fall) along the input are distinct: one pass instead of
    // a sort, for the common case of ids numbered in input order.
    let monotonic =
        (1..n_runs).all(|r| id(r - 1) < id(r)) || (1..n_runs).all(|r| id(r - 1) > id(r));
    if monotonic {
        return Ok(());
    }
    let mut by_id: Vec<(i64, u32)> = (0..n_runs).map(|run| (id(run), run as u32)).collect();
    by_id.par_sort_unstable();
    let returns = by_id
        .windows(2)
        .filter(|pair| pair[0].0 == pair[1].0)
        .min_by_key(|pair| pair[1].1);
    match returns {
        None => Ok(()),
        Some(pair) => {
            let (first, again) = (pair[0].1 as usize, pair[1].1 as usize);
            Err(Error::invalid(format!(
                "group {} is split across the input: sequences {} and {} share the id but \
                 the sequences between them do not; the sequences of a group must be \
                 consecutive",
                pair[0].0,
                starts[first + 1] - 1,
                starts[again]
            )))
        }
    }
}

/// How the costs of the input are read: one column of lengths, or a row-major matrix.
pub enum CostInput<'a, F: Fn(usize, usize) -> i64 + Sync> {
    /// Lengths (column 0 is the only column, with `max_tokens` as its budget).
    Lengths { n: usize, length: F },
    /// `n x columns` costs with a budget per column; column 0 gives segment lengths.
    Matrix {
        n: usize,
        cost: F,
        budgets: &'a [u64],
    },
}

/// The units to pack: their input ranges, their costs per column and the budgets.
#[derive(Debug, Clone)]
pub struct Units {
    /// First input sequence of each unit that is packed, in input order...
    pub first: Vec<u32>,
    /// ... and the sequence after its last.
    pub end: Vec<u32>,
    /// `first.len() x columns` costs, row-major: the members' costs summed, column 0
    /// rounded up per member to `pad_to_multiple_of`, and a last column counting the
    /// members when `max_seqs` is set.
    pub costs: Vec<u64>,
    /// Budget of each column.
    pub budgets: Vec<u64>,
    /// What the oversize policy did (dropped units).
    pub counts: PolicyCounts,
}

impl Units {
    /// Number of units packed.
    pub fn len(&self) -> usize {
        self.first.len()
    }

    /// Number of cost columns.
    pub fn columns(&self) -> usize {
        self.budgets.len()
    }

    /// Costs of unit `u`, one per column.
    #[inline]
    pub fn cost(&self, u: usize) -> &[u64] {
        let m = self.columns();
        &self.costs[u * m..(u + 1) * m]
    }

    /// Cost of unit `u` in column 0, the token column.
    #[inline]
    pub fn tokens(&self, u: usize) -> u64 {
        self.costs[u * self.columns()]
    }

    /// Input sequences in all the units.
    pub fn n_members(&self) -> usize {
        self.first
            .iter()
            .zip(&self.end)
            .map(|(&a, &b)| (b - a) as usize)
            .sum()
    }

    /// Members of unit `u`.
    #[inline]
    pub fn members(&self, u: usize) -> std::ops::Range<usize> {
        self.first[u] as usize..self.end[u] as usize
    }
}

/// Refuse the oversize policies that would cut a group or a multi-budget sequence apart.
pub fn check_policy(options: &PackOptions, what: &str) -> Result<()> {
    match options.oversize {
        Oversize::Error | Oversize::Drop => Ok(()),
        Oversize::Split | Oversize::Truncate => Err(Error::invalid(format!(
            "oversize='{}' cannot be used with {what}: it would cut a unit that must stay \
             whole; use oversize='error' or 'drop'",
            match options.oversize {
                Oversize::Split => "split",
                _ => "truncate",
            }
        ))),
    }
}

/// The units of the input: one per run of `runs` (or per sequence), with their costs
/// summed per column, a count column if `options.max_seqs` is set, and those over a
/// budget refused or dropped as `options.oversize` says.
///
/// With `padded`, a unit's column-0 cost is `members x` its longest member's cost (what
/// it costs in a padded batch of its own) instead of the sum.
pub fn gather<F: Fn(usize, usize) -> i64 + Sync>(
    input: &CostInput<'_, F>,
    runs: Option<&[u32]>,
    groups: Option<&[i64]>,
    options: &PackOptions,
    padded: bool,
) -> Result<Units> {
    let (n, raw, mut budgets): (usize, &F, Vec<u64>) = match input {
        CostInput::Lengths { n, length } => (*n, length, vec![options.max_tokens]),
        CostInput::Matrix { n, cost, budgets } => (*n, cost, budgets.to_vec()),
    };
    check_count(n)?;
    let given = budgets.len();
    let counted = options.max_seqs != u64::MAX;
    if counted {
        budgets.push(options.max_seqs.min(MAX_TOKENS_LIMIT));
    }
    let m = budgets.len();
    let is_matrix = matches!(input, CostInput::Matrix { .. });
    let name = |i: usize, c: usize| {
        if is_matrix {
            format!("costs[{i}, {c}]")
        } else {
            format!("lengths[{i}]")
        }
    };
    let n_units = runs.map_or(n, |starts| starts.len() - 1);
    let mut units = Units {
        first: with_capacity_huge(n_units),
        end: with_capacity_huge(n_units),
        costs: with_capacity_huge(n_units * m),
        budgets,
        counts: PolicyCounts::default(),
    };
    let mut input_tokens = 0u64;
    let mut cost = vec![0u64; m];
    for u in 0..n_units {
        let (first, end) = match runs {
            Some(starts) => (starts[u] as usize, starts[u + 1] as usize),
            None => (u, u + 1),
        };
        cost.iter_mut().for_each(|c| *c = 0);
        let (mut tokens, mut longest) = (0u64, 0u64);
        for i in first..end {
            for (c, total) in cost.iter_mut().enumerate().take(given) {
                let value = raw(i, c);
                if value < 0 {
                    let unit = if is_matrix {
                        "costs"
                    } else {
                        "sequence lengths"
                    };
                    return Err(Error::invalid(format!(
                        "{} = {value} is negative; {unit} must be >= 0",
                        name(i, c)
                    )));
                }
                let value = value as u64;
                let charged = if c == 0 { options.cost(value) } else { value };
                *total = total.saturating_add(charged);
                if c == 0 {
                    tokens += value;
                    longest = longest.max(charged);
                }
            }
            if counted {
                cost[m - 1] += 1;
            }
        }
        if padded {
            cost[0] = longest.saturating_mul((end - first) as u64);
        }
        input_tokens = input_tokens
            .checked_add(tokens)
            .ok_or_else(|| Error::overflow("the lengths sum to more than 2^64 - 1 tokens"))?;
        let over = (0..m).find(|&c| cost[c] > units.budgets[c]);
        if let Some(c) = over {
            if options.oversize == Oversize::Drop {
                units.counts.dropped_seqs += (end - first) as u64;
                units.counts.dropped_tokens += tokens;
                continue;
            }
            return Err(oversize_error(
                (first, end),
                groups,
                c,
                (cost[c], units.budgets[c]),
                (is_matrix, counted && c == m - 1),
            ));
        }
        units.first.push(first as u32);
        units.end.push(end as u32);
        units.costs.extend_from_slice(&cost);
    }
    units.counts.input_tokens = input_tokens;
    Ok(units)
}

/// The error for the unit of sequences `first..end` whose cost `cost` in column `column`
/// is over its `budget`.
fn oversize_error(
    (first, end): (usize, usize),
    groups: Option<&[i64]>,
    column: usize,
    (cost, budget): (u64, u64),
    (is_matrix, is_count): (bool, bool),
) -> Error {
    let unit = match groups {
        Some(ids) => format!(
            "group {} (sequences {first} to {}, {} sequences)",
            ids[first],
            end - 1,
            end - first
        ),
        None => format!("sequence {first}"),
    };
    let over = if is_count {
        format!("holds {cost} sequences, more than max_seqs={budget}")
    } else if is_matrix {
        format!(
            "costs {cost} in column {column}, more than its budget max_costs[{column}]={budget}"
        )
    } else {
        format!("costs {cost} tokens, more than max_tokens={budget}")
    };
    Error::OversizeGroup(format!(
        "{unit} {over}; pass oversize='drop' to leave it out"
    ))
}

/// The packing of the members of `units`, unit `u` placed in bin `bin_of[u]`, where
/// `totals` counts units (not members) per bin and their column-0 costs: each bin lists its
/// members in input order, so a group stays consecutive and in order; each costs its
/// units' column-0 costs, or `padded_cost` where given. `length(i)` is the tokens of input
/// sequence `i` (at most the capacity); `outputs` are for [`Units::n_members`] segments,
/// without `starts`.
///
/// The members become segments for the layout of every packing, which scatters them to
/// their bins reading them in input order (reading them bin by bin instead costs a cache
/// miss per unit, several times the whole packing).
pub fn lay_out(
    units: &Units,
    bin_of: &[u32],
    mut totals: BinTotals,
    length: impl Fn(usize) -> i64,
    options: &PackOptions,
    padded_cost: Option<Vec<u64>>,
    outputs: layout::OutputBuffers,
) -> Packing {
    // Members per bin: the smallest unit size times the units, plus what larger units add
    // (one by one: an access to a random bin, which pairs of equal size never need).
    let smallest = (0..units.len())
        .map(|u| units.members(u).len())
        .min()
        .unwrap_or(1) as u32;
    totals.sizes.iter_mut().for_each(|size| *size *= smallest);
    let n_members = units.n_members();
    let kept_all = units.counts.dropped_seqs == 0;
    let mut lengths = with_capacity_huge(n_members);
    let mut member_bins = with_capacity_huge(n_members);
    let mut sequence = (!kept_all).then(|| with_capacity_huge(n_members));
    for (u, &bin) in bin_of.iter().enumerate() {
        let members = units.members(u);
        let extra = members.len() as u32 - smallest;
        if extra > 0 {
            totals.sizes[bin as usize] += extra;
        }
        for i in members {
            lengths.push(length(i) as u32);
            member_bins.push(bin);
            if let Some(sequence) = &mut sequence {
                sequence.push(i as u32);
            }
        }
    }
    let segments = Segments {
        lengths,
        sequence,
        starts: None,
        counts: units.counts.clone(),
    };
    layout::build(
        &segments,
        SegmentBins::Listed(member_bins),
        totals,
        options,
        padded_cost,
        outputs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_accept_any_distinct_ids_and_name_a_returning_one() {
        assert_eq!(runs(&[]).unwrap(), vec![0]);
        assert_eq!(runs(&[5, 5, -1, 9, 9, 9]).unwrap(), vec![0, 2, 3, 6]);
        assert_eq!(runs(&[9, 9, 3, 7]).unwrap(), vec![0, 2, 3, 4]);
        let message = runs(&[1, 1, 2, 3, 1, 2]).unwrap_err().to_string();
        assert!(message.contains("group 1"), "{message}");
        assert!(message.contains("sequences 1 and 4"), "{message}");
    }

    #[test]
    fn policies_that_cut_units_are_refused() {
        for oversize in ["split", "truncate"] {
            let options = PackOptions::new(8, None, 1, oversize, "bfd", 0).unwrap();
            let message = check_policy(&options, "groups").unwrap_err().to_string();
            assert!(message.contains(oversize), "{message}");
        }
    }
}
