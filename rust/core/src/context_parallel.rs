//! Context parallelism over a packed row: which tokens each rank of a context-parallel
//! (CP) group processes.
//!
//! A packed row holds documents one after another, each padded to a multiple of
//! `2 * cp_size` tokens (`cu_seqlens_padded` gives their offsets; `cu_seqlens` counts
//! their real tokens, which come first in each padded document). Causal attention makes
//! a token's cost grow with its position, so an even cut of each document would leave
//! the last rank with the most work. The load-balanced split cuts every padded document
//! into `2 * cp_size` equal chunks and gives rank `r` chunks `r` and `2 * cp_size - 1 - r`:
//! one cheap and one costly chunk, the same total for every rank. This is the layout
//! Transformer Engine's THD context parallelism expects (`thd_get_partitioned_indices`).

use crate::error::{Error, Result};

/// The part of a packed row that one CP rank processes, and its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// Positions in the padded row of the tokens this rank takes, in the rank's order:
    /// for each document, its chunk `r`, then its chunk `2 * cp_size - 1 - r`.
    pub indices: Vec<i64>,
    /// Cumulative count of each document's real (not padding) tokens on this rank.
    pub cu_seqlens: Vec<i64>,
    /// Cumulative count of each document's tokens on this rank (`cu_seqlens_padded / cp_size`).
    pub cu_seqlens_padded: Vec<i64>,
}

/// Check the CP group and the row layout; return `2 * cp_size`, the chunks per document.
fn check_layout(
    cu_seqlens: &[i64],
    cu_seqlens_padded: &[i64],
    cp_size: i64,
    cp_rank: i64,
) -> Result<i64> {
    if cp_size < 1 {
        return Err(Error::invalid(format!(
            "cp_size must be at least 1, got {cp_size}"
        )));
    }
    if !(0..cp_size).contains(&cp_rank) {
        return Err(Error::invalid(format!(
            "cp_rank must be in [0, cp_size - 1] = [0, {}], got {cp_rank}",
            cp_size - 1
        )));
    }
    let chunks = cp_size
        .checked_mul(2)
        .ok_or_else(|| Error::overflow(format!("cp_size={cp_size} is too large")))?;
    check_cumulative(cu_seqlens_padded, "cu_seqlens_padded")?;
    check_cumulative(cu_seqlens, "cu_seqlens")?;
    if cu_seqlens.len() != cu_seqlens_padded.len() {
        return Err(Error::invalid(format!(
            "cu_seqlens has {} entries but cu_seqlens_padded has {}; both need one per \
             document plus one",
            cu_seqlens.len(),
            cu_seqlens_padded.len()
        )));
    }
    for (doc, (real, padded)) in lengths(cu_seqlens)
        .zip(lengths(cu_seqlens_padded))
        .enumerate()
    {
        if padded % chunks != 0 {
            return Err(Error::invalid(format!(
                "document {doc} has {padded} tokens with its padding, not a multiple of \
                 2 * cp_size = {chunks}; pad each document to a multiple of {chunks}"
            )));
        }
        if real > padded {
            return Err(Error::invalid(format!(
                "document {doc} has {real} real tokens but only {padded} with its padding"
            )));
        }
    }
    Ok(chunks)
}

/// Offsets must start at 0 and never decrease.
fn check_cumulative(offsets: &[i64], name: &str) -> Result<()> {
    match offsets.first() {
        None => Err(Error::invalid(format!(
            "{name} is empty; it needs at least the leading 0"
        ))),
        Some(&first) if first != 0 => Err(Error::invalid(format!(
            "{name} must start at 0, got {first}"
        ))),
        Some(_) => match offsets.windows(2).position(|pair| pair[1] < pair[0]) {
            Some(doc) => Err(Error::invalid(format!(
                "{name} decreases at document {doc} ({} -> {})",
                offsets[doc],
                offsets[doc + 1]
            ))),
            None => Ok(()),
        },
    }
}

fn lengths(offsets: &[i64]) -> impl Iterator<Item = i64> + '_ {
    offsets.windows(2).map(|pair| pair[1] - pair[0])
}

/// Append the row positions rank `cp_rank` takes (layout already checked).
fn push_indices(out: &mut Vec<i64>, cu_seqlens_padded: &[i64], chunks: i64, cp_rank: i64) {
    for (&start, padded) in cu_seqlens_padded.iter().zip(lengths(cu_seqlens_padded)) {
        let chunk = padded / chunks;
        for k in [cp_rank, chunks - 1 - cp_rank] {
            let first = start + k * chunk;
            out.extend(first..first + chunk);
        }
    }
}

/// The shard of rank `cp_rank` in a CP group of `cp_size` ranks.
///
/// `cu_seqlens_padded` holds the document offsets in the row (each document's padded
/// length a multiple of `2 * cp_size`), `cu_seqlens` the cumulative real lengths (equal
/// to `cu_seqlens_padded` when nothing is padded).
pub fn shard(
    cu_seqlens: &[i64],
    cu_seqlens_padded: &[i64],
    cp_size: i64,
    cp_rank: i64,
) -> Result<Shard> {
    let chunks = check_layout(cu_seqlens, cu_seqlens_padded, cp_size, cp_rank)?;
    let total = cu_seqlens_padded.last().copied().unwrap_or(0);
    let mut indices = Vec::new();
    indices
        .try_reserve_exact(usize::try_from(total / cp_size).unwrap_or(usize::MAX))
        .map_err(|_| Error::overflow(format!("no memory for a shard of a {total}-token row")))?;
    push_indices(&mut indices, cu_seqlens_padded, chunks, cp_rank);
    let mut local_real = Vec::with_capacity(cu_seqlens.len());
    local_real.push(0);
    let mut sum = 0;
    for (real, padded) in lengths(cu_seqlens).zip(lengths(cu_seqlens_padded)) {
        let chunk = padded / chunks;
        // Real tokens come first, so chunk k holds min(max(real - k * chunk, 0), chunk).
        for k in [cp_rank, chunks - 1 - cp_rank] {
            sum += (real - k * chunk).clamp(0, chunk);
        }
        local_real.push(sum);
    }
    Ok(Shard {
        indices,
        cu_seqlens: local_real,
        cu_seqlens_padded: cu_seqlens_padded.iter().map(|&o| o / cp_size).collect(),
    })
}

/// The row position of every token when the shards of ranks `0, 1, ..., cp_size - 1` are
/// concatenated in rank order: `row[order[i]] = concatenated[i]` puts them back.
pub fn rank_major_order(cu_seqlens_padded: &[i64], cp_size: i64) -> Result<Vec<i64>> {
    let chunks = check_layout(cu_seqlens_padded, cu_seqlens_padded, cp_size, 0)?;
    let total = cu_seqlens_padded.last().copied().unwrap_or(0);
    let mut order = Vec::new();
    order
        .try_reserve_exact(usize::try_from(total).unwrap_or(usize::MAX))
        .map_err(|_| Error::overflow(format!("no memory for the order of a {total}-token row")))?;
    for rank in 0..cp_size {
        push_indices(&mut order, cu_seqlens_padded, chunks, rank);
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Transformer Engine's per-token formula: the source position of token `token` of a
    /// rank, found by a search over the offsets divided by `cp_size`.
    fn te_source_index(token: i64, cu_padded: &[i64], cp_size: i64, rank: i64) -> i64 {
        let local: Vec<i64> = cu_padded.iter().map(|&o| o / cp_size).collect();
        let doc = local.partition_point(|&o| o <= token) - 1;
        let half = (local[doc + 1] - local[doc]) / 2;
        let index = token - local[doc];
        let offset = if index < half {
            rank
        } else {
            2 * cp_size - 2 - rank
        };
        index + local[doc] * cp_size + half * offset
    }

    /// A row: real lengths, padded up to a multiple of `2 * cp_size`.
    fn row() -> impl Strategy<Value = (Vec<i64>, Vec<i64>, i64)> {
        (1i64..6, prop::collection::vec((0i64..40, 0i64..3), 0..12)).prop_map(|(cp, docs)| {
            let chunks = 2 * cp;
            let (mut real, mut padded) = (vec![0], vec![0]);
            for (length, extra_chunks) in docs {
                let rounded = (length + chunks - 1) / chunks * chunks + extra_chunks * chunks;
                real.push(real.last().unwrap() + length);
                padded.push(padded.last().unwrap() + rounded);
            }
            (real, padded, cp)
        })
    }

    proptest! {
        #[test]
        fn matches_transformer_engine_formula((real, padded, cp) in row()) {
            for rank in 0..cp {
                let got = shard(&real, &padded, cp, rank).unwrap();
                let total = *padded.last().unwrap();
                let expected: Vec<i64> = (0..total / cp)
                    .map(|token| te_source_index(token, &padded, cp, rank))
                    .collect();
                prop_assert_eq!(&got.indices, &expected);
            }
        }

        #[test]
        fn ranks_cover_the_row_once_and_chunks_rebuild_it((real, padded, cp) in row()) {
            let total = *padded.last().unwrap();
            let order = rank_major_order(&padded, cp).unwrap();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..total).collect::<Vec<_>>());
            // Chunk k of a document lives on rank min(k, 2cp-1-k), first half for k < cp.
            let shards: Vec<Shard> = (0..cp).map(|r| shard(&real, &padded, cp, r).unwrap()).collect();
            let mut rebuilt = Vec::new();
            for doc in 0..padded.len() - 1 {
                let chunk = ((padded[doc + 1] - padded[doc]) / (2 * cp)) as usize;
                let local_start = (padded[doc] / cp) as usize;
                for k in 0..2 * cp {
                    let (rank, half) = if k < cp { (k, 0) } else { (2 * cp - 1 - k, 1) };
                    let from = local_start + half * chunk;
                    rebuilt.extend_from_slice(&shards[rank as usize].indices[from..from + chunk]);
                }
            }
            prop_assert_eq!(rebuilt, (0..total).collect::<Vec<_>>());
        }

        #[test]
        fn causal_work_is_equal_on_every_rank((real, padded, cp) in row()) {
            // A query at position p inside its document attends to p + 1 keys.
            let work: Vec<i64> = (0..cp)
                .map(|rank| {
                    let s = shard(&real, &padded, cp, rank).unwrap();
                    s.indices
                        .iter()
                        .map(|&i| {
                            let doc = padded.partition_point(|&o| o <= i) - 1;
                            i - padded[doc] + 1
                        })
                        .sum()
                })
                .collect();
            prop_assert!(work.iter().all(|&w| w == work[0]), "{:?}", work);
        }

        #[test]
        fn local_lengths_count_the_tokens_of_each_document((real, padded, cp) in row()) {
            let mut real_total = vec![0; padded.len() - 1];
            for rank in 0..cp {
                let s = shard(&real, &padded, cp, rank).unwrap();
                prop_assert_eq!(
                    &s.cu_seqlens_padded,
                    &padded.iter().map(|&o| o / cp).collect::<Vec<_>>()
                );
                for doc in 0..padded.len() - 1 {
                    let (lo, hi) = (s.cu_seqlens_padded[doc], s.cu_seqlens_padded[doc + 1]);
                    let real_here = s.indices[lo as usize..hi as usize]
                        .iter()
                        .filter(|&&i| i - padded[doc] < real[doc + 1] - real[doc])
                        .count() as i64;
                    prop_assert_eq!(s.cu_seqlens[doc + 1] - s.cu_seqlens[doc], real_here);
                    real_total[doc] += real_here;
                }
            }
            let expected: Vec<i64> = real.windows(2).map(|p| p[1] - p[0]).collect();
            prop_assert_eq!(real_total, expected);
        }
    }

    #[test]
    fn two_ranks_take_outer_and_inner_chunks() {
        // Documents of 8 and 4 padded tokens (real 7 and 3), cp_size 2: chunks of 2 and 1.
        let (real, padded) = ([0, 7, 10], [0, 8, 12]);
        let first = shard(&real, &padded, 2, 0).unwrap();
        assert_eq!(first.indices, vec![0, 1, 6, 7, 8, 11]);
        assert_eq!(first.cu_seqlens, vec![0, 3, 4]);
        assert_eq!(first.cu_seqlens_padded, vec![0, 4, 6]);
        let second = shard(&real, &padded, 2, 1).unwrap();
        assert_eq!(second.indices, vec![2, 3, 4, 5, 9, 10]);
        assert_eq!(second.cu_seqlens, vec![0, 4, 6]);
        assert_eq!(
            rank_major_order(&padded, 2).unwrap(),
            vec![0, 1, 6, 7, 8, 11, 2, 3, 4, 5, 9, 10]
        );
        let alone = shard(&real, &padded, 1, 0).unwrap();
        assert_eq!(alone.indices, (0..12).collect::<Vec<_>>());
        assert_eq!(alone.cu_seqlens, real.to_vec());
    }

    #[test]
    fn bad_layouts_are_errors() {
        let message = |r: Result<Shard>| r.unwrap_err().to_string();
        assert!(message(shard(&[0, 4], &[0, 4], 0, 0)).contains("cp_size"));
        assert!(message(shard(&[0, 4], &[0, 4], 2, 2)).contains("cp_rank"));
        assert!(message(shard(&[0, 4], &[0, 4], 2, -1)).contains("cp_rank"));
        assert!(message(shard(&[0, 4], &[0, 6], 2, 0)).contains("multiple of 2 * cp_size = 4"));
        assert!(message(shard(&[0, 5], &[0, 4], 2, 0)).contains("5 real tokens"));
        assert!(message(shard(&[], &[], 1, 0)).contains("empty"));
        assert!(message(shard(&[1, 4], &[1, 4], 1, 0)).contains("start at 0"));
        assert!(message(shard(&[0, 4, 2], &[0, 4, 4], 1, 0)).contains("decreases"));
        assert!(message(shard(&[0], &[0, 4], 1, 0)).contains("1 entries"));
        assert!(message(shard(&[0], &[0], i64::MAX, 0)).contains("too large"));
        assert!(rank_major_order(&[0, 3], 1).is_err());
        assert!(shard(&[0], &[0], 4, 3).unwrap().indices.is_empty());
    }
}
