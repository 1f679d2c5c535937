//! Packing: the input shape of the `pack` and `batch_padded` targets, a naive reference of
//! the documented semantics (the port of `tokenbatch.reference`), and the invariants.

use arbitrary::Arbitrary;
use tokenbatch_core::packing::{Oversize, PackOptions, Packing, PolicyCounts, MAX_TOKENS_LIMIT};
use tokenbatch_core::rng::{mix_seed, SplitMix64};
use tokenbatch_core::Error;

use crate::{name_or_unknown, Int};

pub const ALGORITHMS: [&str; 4] = ["bfd", "ffd", "next_fit", "first_fit_shuffled"];
pub const OVERSIZE: [&str; 4] = ["error", "truncate", "split", "drop"];

/// Segments beyond this are not packed: the reference is quadratic, and how much memory a
/// split into billions of pieces takes is not what the targets test.
pub const MAX_SEGMENTS: u64 = 1 << 12;

/// Every argument of `pack` and `batch_padded`.
#[derive(Debug, Arbitrary)]
pub struct PackCase {
    pub lengths: Vec<Int>,
    /// Pack `i32` lengths (when they all fit) and require the same result as `i64`.
    pub narrow: bool,
    pub max_tokens: Int,
    pub max_seqs: Option<Int>,
    pub pad_to_multiple_of: Int,
    pub oversize: u8,
    pub algorithm: u8,
    pub seed: u64,
}

impl PackCase {
    pub fn lengths(&self) -> Vec<i64> {
        self.lengths.iter().map(|l| l.get()).collect()
    }

    /// The options, after checking that `PackOptions::new` accepts exactly what the
    /// documented rules allow; `None` when they are (rightly) refused.
    pub fn options(&self) -> Option<PackOptions> {
        let (max_tokens, pad) = (self.max_tokens.get(), self.pad_to_multiple_of.get());
        let max_seqs = self.max_seqs.map(Int::get);
        let oversize = name_or_unknown(&OVERSIZE, self.oversize);
        let algorithm = name_or_unknown(&ALGORITHMS, self.algorithm);
        let valid = (1..=MAX_TOKENS_LIMIT as i64).contains(&max_tokens)
            && max_seqs.is_none_or(|n| n >= 1)
            && (1..=max_tokens).contains(&pad)
            && oversize != "unknown"
            && algorithm != "unknown";
        let built = PackOptions::new(max_tokens, max_seqs, pad, oversize, algorithm, self.seed);
        match built {
            Ok(options) => {
                assert!(valid, "accepted invalid options {self:?}");
                Some(options)
            }
            Err(error) => {
                assert!(!valid, "refused valid options {self:?}: {error}");
                assert!(matches!(error, Error::InvalidValue(_)), "{error:?}");
                None
            }
        }
    }
}

/// Why an input must be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Negative(usize),
    Oversize(usize),
    Overflow,
}

impl Refusal {
    /// Whether the core's `error` is this refusal, naming the same sequence.
    pub fn is(self, error: &Error) -> bool {
        match (self, error) {
            (Refusal::Negative(i), Error::InvalidValue(message)) => {
                message.starts_with(&format!("lengths[{i}] = "))
            }
            (Refusal::Oversize(i), Error::Oversize { index, .. }) => *index == i,
            (Refusal::Overflow, Error::Overflow(_)) => true,
            _ => false,
        }
    }
}

/// A run of tokens of one input sequence.
#[derive(Debug, Clone, Copy)]
struct Segment {
    index: usize,
    start: u64,
    length: u64,
}

/// The refusal the documented rules give, else the number of segments the policy makes.
pub fn screen(lengths: &[i64], options: &PackOptions) -> Result<u64, Refusal> {
    let capacity = options.capacity();
    let first_negative = lengths.iter().position(|&l| l < 0);
    let first_refused = match options.oversize {
        Oversize::Error => lengths.iter().position(|&l| l > capacity as i64),
        _ => None,
    };
    match (first_negative, first_refused) {
        (Some(n), Some(o)) => {
            return Err(if n < o {
                Refusal::Negative(n)
            } else {
                Refusal::Oversize(o)
            })
        }
        (Some(n), None) => return Err(Refusal::Negative(n)),
        (None, Some(o)) => return Err(Refusal::Oversize(o)),
        (None, None) => {}
    }
    let total = lengths
        .iter()
        .try_fold(0u64, |acc, &l| acc.checked_add(l as u64));
    if total.is_none_or(|total| total > i64::MAX as u64) {
        return Err(Refusal::Overflow);
    }
    let mut segments = 0u64;
    for &length in lengths {
        let length = length as u64;
        segments += match options.oversize {
            Oversize::Split if length > capacity => length.div_ceil(capacity),
            Oversize::Drop if length > capacity => 0,
            _ => 1,
        };
    }
    if segments >= u64::from(u32::MAX) {
        return Err(Refusal::Overflow);
    }
    Ok(segments)
}

fn cost(length: u64, options: &PackOptions) -> u64 {
    length.div_ceil(options.pad_to_multiple_of) * options.pad_to_multiple_of
}

/// The segments of valid `lengths` under the oversize policy, in input order.
fn segments(lengths: &[i64], options: &PackOptions) -> (Vec<Segment>, PolicyCounts) {
    let capacity = options.capacity();
    let mut counts = PolicyCounts {
        input_tokens: lengths.iter().map(|&l| l as u64).sum(),
        ..PolicyCounts::default()
    };
    let mut out = Vec::new();
    for (index, &length) in lengths.iter().enumerate() {
        let length = length as u64;
        if length <= capacity {
            out.push(Segment {
                index,
                start: 0,
                length,
            });
            continue;
        }
        match options.oversize {
            Oversize::Truncate => {
                counts.truncated_seqs += 1;
                counts.truncated_tokens += length - capacity;
                out.push(Segment {
                    index,
                    start: 0,
                    length: capacity,
                });
            }
            Oversize::Drop => {
                counts.dropped_seqs += 1;
                counts.dropped_tokens += length;
            }
            Oversize::Split | Oversize::Error => {
                counts.split_seqs += 1;
                let mut start = 0;
                while start < length {
                    let piece = capacity.min(length - start);
                    out.push(Segment {
                        index,
                        start,
                        length: piece,
                    });
                    counts.split_pieces += 1;
                    start += piece;
                }
            }
        }
    }
    (out, counts)
}

/// Segment ids by decreasing cost, ties by id.
fn decreasing(segments: &[Segment], options: &PackOptions) -> Vec<usize> {
    let mut ids: Vec<usize> = (0..segments.len()).collect();
    ids.sort_by_key(|&id| std::cmp::Reverse(cost(segments[id].length, options)));
    ids
}

/// An open bin of the naive fits.
struct Open {
    id: usize,
    room: u64,
    count: u64,
    /// When the room last changed: best fit takes the latest among equal rooms.
    stamp: usize,
}

/// Best fit (least room that fits, latest on ties) or first fit (lowest bin that fits),
/// one linear scan per segment.
fn any_fit(costs: &[u64], options: &PackOptions, best: bool) -> Vec<usize> {
    let mut open: Vec<Open> = Vec::new();
    let mut n_bins = 0;
    let mut bin_of = Vec::with_capacity(costs.len());
    for (time, &c) in costs.iter().enumerate() {
        let fits = open
            .iter()
            .enumerate()
            .filter(|(_, b)| b.room >= c && b.count < options.max_seqs);
        let chosen = if best {
            fits.min_by_key(|(_, b)| (b.room, std::cmp::Reverse(b.stamp)))
                .map(|(i, _)| i)
        } else {
            fits.min_by_key(|(_, b)| b.id).map(|(i, _)| i)
        };
        let slot = chosen.unwrap_or_else(|| {
            open.push(Open {
                id: n_bins,
                room: options.max_tokens,
                count: 0,
                stamp: time,
            });
            n_bins += 1;
            open.len() - 1
        });
        let bin = &mut open[slot];
        bin.room -= c;
        bin.count += 1;
        bin.stamp = time;
        bin_of.push(bin.id);
        if bin.count >= options.max_seqs {
            open.remove(slot);
        }
    }
    bin_of
}

fn next_fit(costs: &[u64], options: &PackOptions) -> Vec<usize> {
    let (mut bin, mut room, mut count) = (None::<usize>, 0, 0);
    costs
        .iter()
        .map(|&c| {
            if bin.is_none() || c > room || count >= options.max_seqs {
                bin = Some(bin.map_or(0, |b| b + 1));
                (room, count) = (options.max_tokens, 0);
            }
            room -= c;
            count += 1;
            bin.unwrap_or(0)
        })
        .collect()
}

/// Padded batches over the decreasing order: a batch grows while `count x longest` fits.
fn padded(costs: &[u64], options: &PackOptions) -> (Vec<usize>, Vec<u64>) {
    let (mut bin_of, mut batch_cost) = (Vec::new(), Vec::<u64>::new());
    let (mut longest, mut count) = (0u64, 0u64);
    for &c in costs {
        let grown = longest.max(c);
        if !batch_cost.is_empty()
            && count < options.max_seqs
            && (count + 1) * grown <= options.max_tokens
        {
            (longest, count) = (grown, count + 1);
        } else {
            batch_cost.push(0);
            (longest, count) = (c, 1);
        }
        if let Some(last) = batch_cost.last_mut() {
            *last = count * longest;
        }
        bin_of.push(batch_cost.len() - 1);
    }
    (bin_of, batch_cost)
}

/// The packing `tokenbatch.reference` defines for valid input (`padded`: `batch_padded`).
pub fn reference(lengths: &[i64], options: &PackOptions, padded_batches: bool) -> Packing {
    let (segments, counts) = segments(lengths, options);
    let order: Vec<usize> = match options.algorithm {
        _ if padded_batches => decreasing(&segments, options),
        tokenbatch_core::packing::Algorithm::BestFitDecreasing
        | tokenbatch_core::packing::Algorithm::FirstFitDecreasing => decreasing(&segments, options),
        tokenbatch_core::packing::Algorithm::NextFit => (0..segments.len()).collect(),
        tokenbatch_core::packing::Algorithm::FirstFitShuffled => {
            let mut ids: Vec<usize> = (0..segments.len()).collect();
            SplitMix64::new(mix_seed(&[options.seed])).shuffle(&mut ids);
            ids
        }
    };
    let costs: Vec<u64> = order
        .iter()
        .map(|&id| cost(segments[id].length, options))
        .collect();
    let (bin_of, padded_cost) = if padded_batches {
        let (bin_of, batch_cost) = padded(&costs, options);
        (bin_of, Some(batch_cost))
    } else {
        let bin_of = match options.algorithm {
            tokenbatch_core::packing::Algorithm::BestFitDecreasing => {
                any_fit(&costs, options, true)
            }
            tokenbatch_core::packing::Algorithm::NextFit => next_fit(&costs, options),
            _ => any_fit(&costs, options, false),
        };
        (bin_of, None)
    };
    let n_bins = bin_of.iter().max().map_or(0, |&b| b + 1);
    let mut members: Vec<Vec<Segment>> = vec![Vec::new(); n_bins];
    let mut segment_bin = vec![0; segments.len()];
    for (position, &id) in order.iter().enumerate() {
        segment_bin[id] = bin_of[position];
    }
    for (segment, &bin) in segments.iter().zip(&segment_bin) {
        members[bin].push(*segment);
    }
    let mut starts = Vec::new();
    let mut packing = Packing {
        bin_offsets: vec![0],
        indices: Vec::new(),
        starts: None,
        lengths: Vec::new(),
        bin_tokens: Vec::new(),
        counts,
        segment_cost: 0,
    };
    for bin in &members {
        for s in bin {
            packing.indices.push(s.index as i64);
            starts.push(s.start as i64);
            packing.lengths.push(s.length as i64);
        }
        packing.bin_offsets.push(packing.indices.len() as i64);
        let tokens: u64 = bin.iter().map(|s| cost(s.length, options)).sum();
        packing.segment_cost += tokens;
        packing.bin_tokens.push(tokens as i64);
    }
    // The core keeps offsets only when some sequence was split (a piece after the first
    // starts past 0); otherwise every offset is 0 and there is no array.
    packing.starts = starts.iter().any(|&start| start != 0).then_some(starts);
    if let Some(batch_cost) = padded_cost {
        packing.bin_tokens = batch_cost.iter().map(|&c| c as i64).collect();
    }
    packing
}

/// The documented guarantees, checked directly on a packing of valid `lengths`.
pub fn check(lengths: &[i64], options: &PackOptions, packing: &Packing, padded_batches: bool) {
    let n_bins = packing.n_bins();
    let n_segments = packing.indices.len();
    assert_eq!(packing.bin_offsets.first(), Some(&0));
    assert_eq!(
        packing.bin_offsets.last().map(|&o| o as usize),
        Some(n_segments)
    );
    assert!(packing
        .starts
        .as_ref()
        .is_none_or(|starts| starts.len() == n_segments));
    assert_eq!(packing.lengths.len(), n_segments);
    assert_eq!(packing.bin_tokens.len(), n_bins);
    let mut largest_costs = Vec::with_capacity(n_bins);
    for bin in 0..n_bins {
        let (lo, hi) = (
            packing.bin_offsets[bin] as usize,
            packing.bin_offsets[bin + 1] as usize,
        );
        assert!(hi > lo, "bin {bin} is empty");
        assert!(
            (hi - lo) as u64 <= options.max_seqs,
            "bin {bin} holds more than max_seqs"
        );
        let costs: Vec<u64> = packing.lengths[lo..hi]
            .iter()
            .map(|&l| cost(l as u64, options))
            .collect();
        let largest = costs.iter().copied().max().unwrap_or(0);
        let expected = if padded_batches {
            costs.len() as u64 * largest
        } else {
            costs.iter().sum()
        };
        assert_eq!(packing.bin_tokens[bin] as u64, expected, "bin {bin} cost");
        assert!(expected <= options.max_tokens, "bin {bin} is over budget");
        let keys: Vec<(i64, i64)> = (lo..hi)
            .map(|s| (packing.indices[s], packing.start(s)))
            .collect();
        assert!(
            keys.windows(2).all(|w| w[0] < w[1]),
            "bin {bin} is not in input order"
        );
        largest_costs.push((largest, costs.iter().copied().min().unwrap_or(0)));
    }
    // Every sequence (every token, under split) exactly once.
    let capacity = options.capacity();
    let mut pieces: Vec<Vec<(u64, u64)>> = vec![Vec::new(); lengths.len()];
    for s in 0..n_segments {
        let index = usize::try_from(packing.indices[s]).unwrap_or(usize::MAX);
        assert!(index < lengths.len(), "segment {s} names sequence {index}");
        pieces[index].push((packing.start(s) as u64, packing.lengths[s] as u64));
    }
    for (i, got) in pieces.iter_mut().enumerate() {
        got.sort_unstable();
        let length = lengths[i] as u64;
        let expected: Vec<(u64, u64)> = match options.oversize {
            _ if length <= capacity => vec![(0, length)],
            Oversize::Drop => vec![],
            Oversize::Truncate => vec![(0, capacity)],
            _ => (0..length)
                .step_by(capacity as usize)
                .map(|s| (s, capacity.min(length - s)))
                .collect(),
        };
        assert_eq!(*got, expected, "sequence {i} of length {length}");
    }
    assert!(
        packing.lower_bound(options) <= n_bins as u64,
        "fewer bins than the lower bound"
    );
    let unlimited = options.max_seqs == u64::MAX;
    if padded_batches {
        // Batches are runs of the decreasing order: no two interleave.
        largest_costs.sort_unstable();
        assert!(
            largest_costs.windows(2).all(|w| w[0].0 <= w[1].1),
            "padded batches interleave"
        );
    } else if unlimited {
        let loads: Vec<u64> = packing.bin_tokens.iter().map(|&t| t as u64).collect();
        match options.algorithm {
            // Any fit: a bin is opened only for a segment no open bin could take, so at
            // most one bin ends at most half full.
            tokenbatch_core::packing::Algorithm::NextFit => {
                assert!(
                    loads.windows(2).all(|w| w[0] + w[1] > options.max_tokens),
                    "next fit left two consecutive bins that fit together"
                );
            }
            _ => {
                let half_empty = loads
                    .iter()
                    .filter(|&&l| 2 * l <= options.max_tokens)
                    .count();
                assert!(half_empty <= 1, "{half_empty} bins are at most half full");
            }
        }
    }
}

/// The whole check of one case: refusals where the rules refuse, else exactly the
/// reference packing, the documented guarantees, and the same result from `i32` lengths.
pub fn run(case: &PackCase, padded_batches: bool) {
    let Some(options) = case.options() else {
        return;
    };
    let lengths = case.lengths();
    let call = |lengths: &[i64]| {
        if padded_batches {
            tokenbatch_core::packing::batch_padded(lengths, &options)
        } else {
            tokenbatch_core::packing::pack(lengths, &options)
        }
    };
    match screen(&lengths, &options) {
        Err(refusal) => match call(&lengths) {
            Ok(_) => panic!("accepted input that must be refused ({refusal:?})"),
            Err(error) => assert!(refusal.is(&error), "expected {refusal:?}, got {error:?}"),
        },
        Ok(segments) if segments > MAX_SEGMENTS => {}
        Ok(_) => {
            let packing = match call(&lengths) {
                Ok(packing) => packing,
                Err(error) => panic!("refused valid input: {error:?}"),
            };
            check(&lengths, &options, &packing, padded_batches);
            assert_eq!(
                packing,
                reference(&lengths, &options, padded_batches),
                "differs from the reference"
            );
            let narrow: Option<Vec<i32>> = lengths.iter().map(|&l| i32::try_from(l).ok()).collect();
            if let (true, Some(narrow)) = (case.narrow, narrow) {
                let from_i32 = if padded_batches {
                    tokenbatch_core::packing::batch_padded(&narrow, &options)
                } else {
                    tokenbatch_core::packing::pack(&narrow, &options)
                };
                assert_eq!(from_i32.ok(), Some(packing), "i32 lengths pack differently");
            }
        }
    }
}
