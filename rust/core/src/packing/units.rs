//! Atomic groups and cost columns: what is packed when a bin must keep sequences together
//! or stay within several budgets.
//!
//! A *group* is a run of consecutive input sequences sharing an id. It is packed as one
//! *unit* whose cost in each column is the sum of its members' costs, then laid out member
//! by member, in input order, so the CSR layout of the result is that of any packing.
//! Without ids every sequence is a unit of one.

use rayon::prelude::*;

use super::options::{Oversize, PackOptions, MAX_TOKENS_LIMIT};
use super::segments::PolicyCounts;
use super::Packing;
use crate::error::{Error, Result};

/// The runs of equal ids in `groups`: the first sequence of each run, then `groups.len()`.
///
/// Refuses an id that comes back after other ids, naming the last sequence of its first
/// run and the first of the run where it returns (the earliest such return in the input).
pub fn runs(groups: &[i64]) -> Result<Vec<u32>> {
    let n = groups.len();
    check_count(n)?;
    let mut starts: Vec<u32> = Vec::new();
    for (i, pair) in groups.windows(2).enumerate() {
        if pair[0] != pair[1] {
            starts.push(i as u32 + 1);
        }
    }
    if n > 0 {
        starts.insert(0, 0);
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
        first: Vec::with_capacity(n_units),
        end: Vec::with_capacity(n_units),
        costs: Vec::with_capacity(n_units * m),
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

/// The units of every bin, listed bin by bin in unit order, from the bin of each unit.
pub fn units_by_bin(bin_of: &[u32], n_bins: usize) -> (Vec<i64>, Vec<i64>) {
    let mut offsets = vec![0i64; n_bins + 1];
    for &bin in bin_of {
        offsets[bin as usize + 1] += 1;
    }
    for b in 0..n_bins {
        offsets[b + 1] += offsets[b];
    }
    let mut next: Vec<i64> = offsets[..n_bins].to_vec();
    let mut listed = vec![0i64; bin_of.len()];
    for (u, &bin) in bin_of.iter().enumerate() {
        listed[next[bin as usize] as usize] = u as i64;
        next[bin as usize] += 1;
    }
    (offsets, listed)
}

/// The packing of the members of `units` placed bin by bin as `unit_offsets` (`n_bins +
/// 1` offsets into `unit_ids`) says; each bin costs its units' column-0 costs, or
/// `padded_cost` where given. `length(i)` is the tokens of input sequence `i`.
pub fn expand(
    units: &Units,
    unit_offsets: &[i64],
    unit_ids: &[i64],
    length: impl Fn(usize) -> i64,
    padded_cost: Option<Vec<u64>>,
) -> Packing {
    let n_bins = unit_offsets.len().saturating_sub(1);
    let n_members: usize = (0..units.len()).map(|u| units.members(u).len()).sum();
    let mut bin_offsets = Vec::with_capacity(n_bins + 1);
    let mut indices = Vec::with_capacity(n_members);
    let mut lengths = Vec::with_capacity(n_members);
    let mut bin_tokens = Vec::with_capacity(n_bins);
    bin_offsets.push(0i64);
    let mut segment_cost = 0u64;
    for bin in 0..n_bins {
        let mut tokens = 0u64;
        for &u in &unit_ids[unit_offsets[bin] as usize..unit_offsets[bin + 1] as usize] {
            let u = u as usize;
            tokens += units.tokens(u);
            for i in units.members(u) {
                indices.push(i as i64);
                lengths.push(length(i));
            }
        }
        segment_cost += tokens;
        bin_tokens.push(tokens as i64);
        bin_offsets.push(indices.len() as i64);
    }
    if let Some(padded) = padded_cost {
        bin_tokens = padded.into_iter().map(|cost| cost as i64).collect();
    }
    Packing {
        bin_offsets,
        indices,
        starts: None,
        lengths,
        bin_tokens,
        counts: units.counts.clone(),
        segment_cost,
    }
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
