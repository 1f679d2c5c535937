//! Turning input lengths into the segments that get packed, under the oversize policy.
//!
//! A segment is a run of tokens of one input sequence: the whole sequence, its first
//! `capacity` tokens (truncate) or one piece of it (split). When every sequence maps to
//! exactly one segment starting at token 0, the sequence index *is* the segment id and
//! no index or start arrays are allocated.

use rayon::prelude::*;

use super::options::{Oversize, PackOptions};
use crate::buffers::zeroed_vec;
use crate::error::{Error, Result};

/// An integer length type accepted from callers (numpy int32 or int64 arrays).
pub trait Length: Copy + Send + Sync {
    /// The value widened to `i64`.
    fn to_i64(self) -> i64;
}

impl Length for i32 {
    #[inline]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

impl Length for i64 {
    #[inline]
    fn to_i64(self) -> i64 {
        self
    }
}

/// Costs of units of several sequences (see `units`), which are below the budget and so
/// below `i64::MAX`.
impl Length for u64 {
    #[inline]
    fn to_i64(self) -> i64 {
        self as i64
    }
}

/// What the oversize policy did, for the packing summary.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyCounts {
    /// Sum of the input lengths.
    pub input_tokens: u64,
    /// Sequences left out (`oversize="drop"`).
    pub dropped_seqs: u64,
    /// Tokens of the sequences left out.
    pub dropped_tokens: u64,
    /// Sequences cut to the capacity (`oversize="truncate"`).
    pub truncated_seqs: u64,
    /// Tokens removed by truncation.
    pub truncated_tokens: u64,
    /// Sequences cut into pieces (`oversize="split"`).
    pub split_seqs: u64,
    /// Pieces those sequences became.
    pub split_pieces: u64,
}

/// The segments to pack, in input order.
#[derive(Debug, Clone)]
pub struct Segments {
    /// Length of each segment (at most the capacity, so it fits `u32`).
    pub lengths: Vec<u32>,
    /// Input sequence of each segment; `None` means segment `i` is sequence `i`.
    pub sequence: Option<Vec<u32>>,
    /// Token offset of each segment in its sequence; `None` means all zero.
    pub starts: Option<Vec<u64>>,
    /// What the policy did.
    pub counts: PolicyCounts,
}

impl Segments {
    /// Number of segments.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    /// What the outputs of a layout of these segments hold: their count, and whether
    /// they need `starts` (some sequence was split).
    pub fn output_shape(&self) -> (usize, bool) {
        (self.len(), self.starts.is_some())
    }

    /// Input sequence of segment `id`.
    #[inline]
    pub fn sequence_of(&self, id: usize) -> u32 {
        match &self.sequence {
            Some(sequence) => sequence[id],
            None => id as u32,
        }
    }
}

/// The pieces `(start, length)` that a run of `length` tokens is cut into so that none is
/// longer than `capacity` (> 0): full pieces from the front, the remainder last.
///
/// The one splitter of tokenbatch: the oversize policy cuts sequences with it, and so does
/// the planner when it must cut sequences to give every rank the same number of batches.
pub fn pieces(length: u64, capacity: u64) -> impl Iterator<Item = (u64, u64)> {
    let capacity = capacity.max(1);
    (0..length.div_ceil(capacity)).map(move |piece| {
        let start = piece * capacity;
        (start, (length - start).min(capacity))
    })
}

/// Lengths validated per parallel task.
const SCAN_CHUNK: usize = 1 << 16;

/// What one pass over the lengths finds (merged across parallel chunks).
#[derive(Debug, Clone, Default)]
struct Scan {
    first_negative: Option<usize>,
    first_oversize: Option<usize>,
    /// Sum of the lengths; `None` once it overflows.
    total: Option<u64>,
    n_oversize: u64,
    /// Pieces beyond the first that oversize sequences would split into.
    extra_pieces: u64,
    /// Tokens beyond the capacity in oversize sequences (what truncation removes).
    excess_tokens: u64,
}

impl Scan {
    /// The scan of no lengths.
    fn empty() -> Self {
        Scan {
            total: Some(0),
            ..Scan::default()
        }
    }

    /// Scan `values` (input indices from `offset`) and write each length, capped at the
    /// capacity, to `capped`: what the packing reads when no sequence is split or dropped.
    fn of<L: Length>(values: &[L], offset: usize, capacity: u64, capped: &mut [u32]) -> Self {
        // The common case in one loop without branches (it vectorizes): the sum, with a
        // flag for wrapping, and the extremes, which say whether anything needs a look.
        let (mut total, mut wrapped) = (0u64, false);
        let (mut smallest, mut largest) = (i64::MAX, 0i64);
        for (slot, &value) in capped.iter_mut().zip(values) {
            let length = value.to_i64();
            smallest = smallest.min(length);
            largest = largest.max(length);
            let (sum, carry) = total.overflowing_add(length as u64);
            total = sum;
            wrapped |= carry;
            *slot = (length as u64).min(capacity) as u32;
        }
        if smallest >= 0 && largest as u64 <= capacity && !wrapped {
            return Scan {
                total: Some(total),
                ..Scan::empty()
            };
        }
        Self::with_exceptions(values, offset, capacity)
    }

    /// The scan of lengths some of which are negative, oversize or sum beyond `u64`.
    fn with_exceptions<L: Length>(values: &[L], offset: usize, capacity: u64) -> Self {
        let mut scan = Scan::empty();
        for (i, &value) in values.iter().enumerate() {
            let length = value.to_i64();
            if length < 0 {
                scan.first_negative.get_or_insert(offset + i);
                continue;
            }
            let length = length as u64;
            scan.total = scan.total.and_then(|total| total.checked_add(length));
            if length > capacity {
                scan.first_oversize.get_or_insert(offset + i);
                scan.n_oversize += 1;
                scan.extra_pieces = scan
                    .extra_pieces
                    .saturating_add(length.div_ceil(capacity) - 1);
                scan.excess_tokens = scan.excess_tokens.saturating_add(length - capacity);
            }
        }
        scan
    }

    /// Combine the scans of two consecutive chunks (`self` first).
    fn merge(self, later: Scan) -> Scan {
        Scan {
            first_negative: self.first_negative.or(later.first_negative),
            first_oversize: self.first_oversize.or(later.first_oversize),
            total: self
                .total
                .zip(later.total)
                .and_then(|(a, b)| a.checked_add(b)),
            n_oversize: self.n_oversize + later.n_oversize,
            extra_pieces: self.extra_pieces.saturating_add(later.extra_pieces),
            excess_tokens: self.excess_tokens.saturating_add(later.excess_tokens),
        }
    }
}

/// What the oversize policy made of one sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fate {
    /// It fits: one segment, the whole sequence.
    Whole,
    /// Cut to the capacity; `removed` tokens left out.
    Truncated { removed: u64 },
    /// Cut into `pieces` segments of at most the capacity.
    Split { pieces: u64 },
    /// Left out.
    Dropped,
}

impl Fate {
    /// Segments the sequence became.
    pub fn segments(self) -> u64 {
        match self {
            Fate::Whole | Fate::Truncated { .. } => 1,
            Fate::Split { pieces } => pieces,
            Fate::Dropped => 0,
        }
    }
}

impl PolicyCounts {
    /// Count what the policy did to one sequence of `length` tokens.
    pub fn record(&mut self, fate: Fate, length: u64) {
        match fate {
            Fate::Whole => {}
            Fate::Truncated { removed } => {
                self.truncated_seqs += 1;
                self.truncated_tokens += removed;
            }
            Fate::Split { pieces } => {
                self.split_seqs += 1;
                self.split_pieces += pieces;
            }
            Fate::Dropped => {
                self.dropped_seqs += 1;
                self.dropped_tokens += length;
            }
        }
    }
}

/// Apply the oversize policy to sequence `index` of `length` tokens: hand each segment it
/// becomes to `emit(start, length)`, in token order, and say what happened. This is the
/// one place that splits, truncates, drops or refuses a sequence: packing and the stream
/// packer both go through it.
pub fn place_sequence(
    index: usize,
    length: u64,
    options: &PackOptions,
    mut emit: impl FnMut(u64, u64),
) -> Result<Fate> {
    let capacity = options.capacity();
    if length <= capacity {
        emit(0, length);
        return Ok(Fate::Whole);
    }
    match options.oversize {
        Oversize::Error => Err(oversize_error(index, length as i64, options)),
        Oversize::Truncate => {
            emit(0, capacity);
            Ok(Fate::Truncated {
                removed: length - capacity,
            })
        }
        Oversize::Split => {
            let mut count = 0;
            for (start, piece) in pieces(length, capacity) {
                emit(start, piece);
                count += 1;
            }
            Ok(Fate::Split { pieces: count })
        }
        Oversize::Drop => Ok(Fate::Dropped),
    }
}

/// The error for sequence `index` of `length` tokens under `oversize="error"`.
fn oversize_error(index: usize, length: i64, options: &PackOptions) -> Error {
    let capacity = options.capacity();
    let detail = if capacity < options.max_tokens {
        format!(
            " (at most {capacity} with pad_to_multiple_of={})",
            options.pad_to_multiple_of
        )
    } else {
        String::new()
    };
    Error::Oversize {
        index,
        length,
        max_tokens: options.max_tokens,
        detail,
    }
}

/// Validate `lengths` and apply the oversize policy.
pub fn segment<L: Length>(lengths: &[L], options: &PackOptions) -> Result<Segments> {
    if lengths.len() >= u32::MAX as usize {
        return Err(Error::overflow(format!(
            "{} sequences is more than the supported {}",
            lengths.len(),
            u32::MAX - 1
        )));
    }
    let capacity = options.capacity();
    // Capped lengths are written during the scan: they are the segments' lengths unless
    // something is split or dropped (then they are thrown away). A zeroed allocation is
    // mapped lazily, so each page is touched once, by the write.
    let mut capped = zeroed_vec!(u32, lengths.len());
    let scan = lengths
        .par_chunks(SCAN_CHUNK)
        .zip(capped.par_chunks_mut(SCAN_CHUNK))
        .enumerate()
        .map(|(chunk, (values, capped))| Scan::of(values, chunk * SCAN_CHUNK, capacity, capped))
        .reduce(Scan::empty, Scan::merge);
    let refused = scan
        .first_oversize
        .filter(|_| options.oversize == Oversize::Error);
    match (scan.first_negative, refused) {
        (Some(index), other) if other.is_none_or(|oversize| index < oversize) => {
            let length = lengths[index].to_i64();
            return Err(Error::invalid(format!(
                "lengths[{index}] = {length} is negative; sequence lengths must be >= 0"
            )));
        }
        (_, Some(index)) => {
            return Err(oversize_error(index, lengths[index].to_i64(), options));
        }
        _ => {}
    }
    let mut counts = PolicyCounts {
        input_tokens: scan
            .total
            .ok_or_else(|| Error::overflow("the lengths sum to more than 2^64 - 1 tokens"))?,
        ..PolicyCounts::default()
    };
    let (n_oversize, extra_pieces) = (scan.n_oversize, scan.extra_pieces);
    if counts.input_tokens > i64::MAX as u64 {
        return Err(Error::overflow(format!(
            "the lengths sum to {} tokens, more than 2^63 - 1",
            counts.input_tokens
        )));
    }
    let n_segments = match options.oversize {
        Oversize::Split => lengths.len() as u64 + extra_pieces,
        Oversize::Drop => lengths.len() as u64 - n_oversize,
        Oversize::Error | Oversize::Truncate => lengths.len() as u64,
    };
    if n_segments >= u64::from(u32::MAX) {
        return Err(Error::overflow(format!(
            "splitting would create {n_segments} segments, more than the supported {}",
            u32::MAX - 1
        )));
    }

    let whole = n_oversize == 0 || options.oversize == Oversize::Truncate;
    if whole {
        if n_oversize > 0 {
            counts.truncated_seqs = n_oversize;
            counts.truncated_tokens = scan.excess_tokens;
        }
        return Ok(Segments {
            lengths: capped,
            sequence: None,
            starts: None,
            counts,
        });
    }

    let n_segments = n_segments as usize;
    let mut seg_lengths = Vec::with_capacity(n_segments);
    let mut seg_sequence = Vec::with_capacity(n_segments);
    let mut seg_starts = Vec::with_capacity(if options.oversize == Oversize::Split {
        n_segments
    } else {
        0
    });
    let split = options.oversize == Oversize::Split;
    for (index, &value) in lengths.iter().enumerate() {
        let length = value.to_i64() as u64;
        let fate = place_sequence(index, length, options, |start, piece| {
            seg_lengths.push(piece as u32);
            seg_sequence.push(index as u32);
            if split {
                seg_starts.push(start);
            }
        })?;
        counts.record(fate, length);
    }
    Ok(Segments {
        lengths: seg_lengths,
        sequence: Some(seg_sequence),
        starts: (options.oversize == Oversize::Split).then_some(seg_starts),
        counts,
    })
}
