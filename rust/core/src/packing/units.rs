//! Atomic groups and cost columns: what is packed when a bin must keep sequences together
//! or stay within several budgets.
//!
//! A *group* is a run of consecutive input sequences sharing an id. It is packed as one
//! *unit* whose cost in each column is the sum of its members' costs, then laid out member
//! by member, in input order, so the CSR layout of the result is that of any packing.
//! Without ids every sequence is a unit of one.

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::assign::BinTotals;
use super::layout;
use super::options::{Oversize, PackOptions, MAX_TOKENS_LIMIT};
use super::order::SegmentBins;
use super::segments::{PolicyCounts, Segments};
use super::Packing;
use crate::buffers::{with_capacity_huge, zeroed_vec};
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
    let members = |u: usize| match runs {
        Some(starts) => starts[u] as usize..starts[u + 1] as usize,
        None => u..u + 1,
    };
    let over_budget = |cost: &[u64]| {
        cost.iter()
            .zip(&budgets)
            .any(|(cost, budget)| cost > budget)
    };
    // The costs of every unit, in parallel; the first unit (in input order) with a
    // negative cost and the first over a budget are kept for the errors.
    let mut costs = zeroed_vec!(u64, n_units * m);
    let (first_negative, first_over) = (AtomicUsize::new(usize::MAX), AtomicUsize::new(usize::MAX));
    let input_tokens: u128 = costs
        .par_chunks_mut(m)
        .enumerate()
        .map(|(u, cost)| {
            let (mut tokens, mut longest, mut negative) = (0u128, 0u64, false);
            for i in members(u) {
                for (c, total) in cost.iter_mut().enumerate().take(given) {
                    let value = raw(i, c);
                    if value < 0 {
                        negative = true;
                        continue;
                    }
                    let value = value as u64;
                    let charged = if c == 0 { options.cost(value) } else { value };
                    *total = total.saturating_add(charged);
                    if c == 0 {
                        tokens += u128::from(value);
                        longest = longest.max(charged);
                    }
                }
            }
            let size = members(u).len() as u64;
            if counted {
                cost[m - 1] = size;
            }
            if padded {
                cost[0] = longest.saturating_mul(size);
            }
            if negative {
                // Refused, or past a refused unit: its tokens are never counted.
                first_negative.fetch_min(u, Ordering::Relaxed);
                return 0;
            }
            if over_budget(cost) {
                first_over.fetch_min(u, Ordering::Relaxed);
            }
            tokens
        })
        .sum();
    let (negative, over) = (first_negative.into_inner(), first_over.into_inner());
    // Sequentially, the first negative cost stops the gathering, unless an earlier unit
    // over a budget stopped it first (dropped units do not stop it).
    if negative != usize::MAX && (negative < over || options.oversize == Oversize::Drop) {
        let (i, c) = members(negative)
            .flat_map(|i| (0..given).map(move |c| (i, c)))
            .find(|&(i, c)| raw(i, c) < 0)
            .unwrap_or((members(negative).start, 0));
        let unit = if is_matrix {
            "costs"
        } else {
            "sequence lengths"
        };
        return Err(Error::invalid(format!(
            "{} = {} is negative; {unit} must be >= 0",
            name(i, c),
            raw(i, c)
        )));
    }
    let input_tokens = u64::try_from(input_tokens)
        .map_err(|_| Error::overflow("the lengths sum to more than 2^64 - 1 tokens"))?;
    let counts = PolicyCounts {
        input_tokens,
        ..PolicyCounts::default()
    };
    if over == usize::MAX {
        let (mut first, mut end) = (with_capacity_huge(n_units), with_capacity_huge(n_units));
        match runs {
            Some(starts) => {
                first.extend_from_slice(&starts[..n_units]);
                end.extend_from_slice(&starts[1..]);
            }
            None => {
                first.extend(0..n as u32);
                end.extend(1..=n as u32);
            }
        }
        return Ok(Units {
            first,
            end,
            costs,
            budgets,
            counts,
        });
    }
    if options.oversize != Oversize::Drop {
        let range = members(over);
        let cost = &costs[over * m..(over + 1) * m];
        let c = (0..m).find(|&c| cost[c] > budgets[c]).unwrap_or(0);
        return Err(oversize_error(
            (range.start, range.end),
            groups,
            c,
            (cost[c], budgets[c]),
            (is_matrix, counted && c == m - 1),
        ));
    }
    let mut units = Units {
        first: with_capacity_huge(n_units),
        end: with_capacity_huge(n_units),
        costs: with_capacity_huge(n_units * m),
        budgets: budgets.clone(),
        counts,
    };
    for (u, cost) in costs.chunks(m).enumerate() {
        let range = members(u);
        if over_budget(cost) {
            units.counts.dropped_seqs += range.len() as u64;
            units.counts.dropped_tokens += range.map(|i| raw(i, 0) as u64).sum::<u64>();
        } else {
            units.first.push(range.start as u32);
            units.end.push(range.end as u32);
            units.costs.extend_from_slice(cost);
        }
    }
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

    /// Gather `lengths` in groups of two under a budget of 8, with `oversize`.
    fn gather_pairs(lengths: &[i64], oversize: &str) -> Result<Units> {
        let options = PackOptions::new(8, None, 1, oversize, "bfd", 0).unwrap();
        let ids: Vec<i64> = (0..lengths.len() as i64).map(|i| i / 2).collect();
        let starts = runs(&ids).unwrap();
        let input = CostInput::Lengths {
            n: lengths.len(),
            length: |i: usize, _| lengths[i],
        };
        gather(&input, Some(&starts), Some(&ids), &options, false)
    }

    #[test]
    fn the_first_bad_unit_in_input_order_gives_the_error() {
        // Gathered in parallel, refused as a pass in input order would refuse.
        let over_first = gather_pairs(&[1, 1, 5, 5, 1, -3], "error")
            .unwrap_err()
            .to_string();
        assert!(
            over_first.contains("group 1 (sequences 2 to 3"),
            "{over_first}"
        );
        let negative_first = gather_pairs(&[1, -3, 5, 5], "error")
            .unwrap_err()
            .to_string();
        assert!(
            negative_first.contains("lengths[1] = -3"),
            "{negative_first}"
        );
        // Not rounded up to the padding multiple (which would overflow) before it is refused.
        let options = PackOptions::new(8, None, 8, "error", "bfd", 0).unwrap();
        let padded = crate::packing::pack_grouped(&[1i64, -3], &[0, 0], &options);
        assert!(padded.unwrap_err().to_string().contains("lengths[1] = -3"));
        // Dropped units do not stop the pass: the negative length after them does.
        let dropped = gather_pairs(&[9, 1, 1, 1, 1, -3], "drop")
            .unwrap_err()
            .to_string();
        assert!(dropped.contains("lengths[5] = -3"), "{dropped}");
        let units = gather_pairs(&[9, 1, 2, 3, 4, 5, 1, 1], "drop").unwrap();
        assert_eq!((units.first, units.end), (vec![2, 6], vec![4, 8]));
        assert_eq!(units.costs, vec![5, 2]);
        assert_eq!(units.counts.dropped_seqs, 4);
        assert_eq!(units.counts.dropped_tokens, 19);
        assert_eq!(units.counts.input_tokens, 26);
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
