//! Packing a stream of unknown length with a bounded buffer.
//!
//! Items arrive one at a time ([`StreamBuffer::push`]) and become segments under the
//! oversize policy (the splitter of [`place_sequence`]). When the buffer holds
//! `buffer_size` segments it is packed with [`pack`]: the fullest bins leave (those at
//! least 99.5% full, then the fullest others) until at most half of the buffer is still
//! occupied; the least-filled bins stay, to be packed again with the next items. At the
//! end of the stream ([`StreamBuffer::finish`]) everything left leaves. Bins that leave
//! together are optionally shuffled, with a generator seeded by `(seed, shard, round)`.
//!
//! Every choice is a function of the pushed `(position, length)` sequence and the
//! configuration: the state ([`StreamState`]) is small (positions and lengths, never
//! tokens) and a restored buffer continues exactly where the saved one stopped.

use std::collections::{HashMap, VecDeque};

use super::options::PackOptions;
use super::pack;
use super::segments::{place_sequence, Fate};
use crate::error::{Error, Result};
use crate::rng::{mix_seed, SplitMix64};

/// Version of the stream packer's behaviour and state. A state saved under another
/// version would not continue the same stream, so it is refused. Version 2: the buffer
/// policy and the shuffle moved into the core (its generator differs from version 1's).
pub const STREAM_STATE_VERSION: u32 = 2;

/// A bin this full leaves the buffer even when there is room to keep it: packing it again
/// could gain at most half a percent of a bin. As a fraction: numerator / denominator.
const FULL_ENOUGH: (u64, u64) = (995, 1000);

/// Tokens `start .. start + length` of the stream item at `position`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamSegment {
    pub position: u64,
    pub start: u64,
    pub length: u64,
}

/// How a stream is packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConfig {
    /// Budget, segments per bin, oversize policy and algorithm of each buffer packing
    /// (`pad_to_multiple_of` is 1; `seed` seeds the shuffle).
    pub options: PackOptions,
    /// Segments held at most before the buffer is packed (at least 2).
    pub buffer_size: usize,
    /// Shuffle the bins that leave the buffer together.
    pub shuffle: bool,
    /// This packer reads the items at positions `p` with `p % num_shards == shard`.
    pub num_shards: u64,
    pub shard: u64,
}

impl StreamConfig {
    /// Check and build a configuration from the raw values a caller passes.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        max_tokens: i64,
        buffer_size: i64,
        algorithm: &str,
        max_seqs: Option<i64>,
        oversize: &str,
        shuffle: bool,
        seed: u64,
        num_shards: i64,
        shard: i64,
    ) -> Result<Self> {
        let options = PackOptions::new(max_tokens, max_seqs, 1, oversize, algorithm, seed)?;
        if buffer_size < 2 {
            return Err(Error::invalid(format!(
                "buffer_size must be at least 2, got {buffer_size}"
            )));
        }
        if num_shards < 1 {
            return Err(Error::invalid(format!(
                "num_shards must be at least 1, got {num_shards}"
            )));
        }
        if !(0..num_shards).contains(&shard) {
            return Err(Error::invalid(format!(
                "shard must be in [0, num_shards - 1] = [0, {}], got shard={shard}",
                num_shards - 1
            )));
        }
        Ok(Self {
            options,
            buffer_size: usize::try_from(buffer_size).map_err(|_| {
                Error::overflow(format!("buffer_size={buffer_size} does not fit in memory"))
            })?,
            shuffle,
            num_shards: num_shards as u64,
            shard: shard as u64,
        })
    }
}

/// Where a stream packer stands between two bins: enough to continue exactly.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamState {
    /// The next stream position this shard reads.
    pub next_position: u64,
    /// Buffer packings so far (seeds the shuffle of the next one).
    pub round: u64,
    /// Bins taken so far.
    pub yielded_bins: u64,
    /// Items left out so far (`oversize="drop"`).
    pub dropped_seqs: u64,
    /// Segments waiting in the buffer.
    pub buffer: Vec<StreamSegment>,
    /// Bins that left the buffer and were not taken yet, in the order they will be.
    pub pending: Vec<Vec<StreamSegment>>,
}

/// A bin handed out by [`StreamBuffer::take_bin`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenBin {
    /// Its segments, in stream order.
    pub segments: Vec<StreamSegment>,
    /// Positions of the items none of whose segments is held any more (their last segment
    /// was in this bin): the caller can let go of them.
    pub released: Vec<u64>,
}

/// The buffer of a stream packer: it decides when to pack, which bins leave, in which
/// order, and what happens to items longer than the budget.
#[derive(Debug, Clone)]
pub struct StreamBuffer {
    config: StreamConfig,
    next_position: u64,
    round: u64,
    yielded_bins: u64,
    dropped_seqs: u64,
    buffer: Vec<StreamSegment>,
    pending: VecDeque<Vec<StreamSegment>>,
    /// Segments held (buffered or pending) of each item that has any.
    held: HashMap<u64, u64>,
}

impl StreamBuffer {
    /// An empty buffer at the start of the shard.
    pub fn new(config: StreamConfig) -> Self {
        Self {
            next_position: config.shard,
            config,
            round: 0,
            yielded_bins: 0,
            dropped_seqs: 0,
            buffer: Vec::new(),
            pending: VecDeque::new(),
            held: HashMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &StreamConfig {
        &self.config
    }

    /// Admit the item at `position` (the shard's next position or a later one of the
    /// shard) with `length` tokens; returns how many segments it became (0: dropped).
    pub fn push(&mut self, position: u64, length: i64) -> Result<u64> {
        let StreamConfig {
            num_shards, shard, ..
        } = self.config;
        if position % num_shards != shard || position < self.next_position {
            return Err(Error::invalid(format!(
                "stream position {position} is not the next one of shard {shard} of \
                 {num_shards} (expected {} or a later position p with p % {num_shards} == \
                 {shard})",
                self.next_position
            )));
        }
        let Ok(tokens) = u64::try_from(length) else {
            return Err(Error::invalid(format!(
                "stream item {position} has length {length}; lengths must be >= 0"
            )));
        };
        let index = usize::try_from(position).unwrap_or(usize::MAX);
        let buffer = &mut self.buffer;
        let fate = place_sequence(index, tokens, &self.config.options, |start, length| {
            buffer.push(StreamSegment {
                position,
                start,
                length,
            });
        })?;
        self.next_position = position.saturating_add(num_shards);
        if fate == Fate::Dropped {
            self.dropped_seqs += 1;
        } else {
            self.held.insert(position, fate.segments());
        }
        Ok(fate.segments())
    }

    /// The buffer holds `buffer_size` segments: [`repack`](Self::repack) before pushing more.
    pub fn is_full(&self) -> bool {
        self.buffer.len() >= self.config.buffer_size
    }

    /// Pack the buffer; the bins that leave become pending. At most half the buffer stays.
    pub fn repack(&mut self) -> Result<()> {
        self.pack_buffer(false)
    }

    /// The stream ended: pack what is left, and let every bin leave.
    pub fn finish(&mut self) -> Result<()> {
        self.pack_buffer(true)
    }

    fn pack_buffer(&mut self, everything: bool) -> Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let lengths: Vec<i64> = self.buffer.iter().map(|s| s.length as i64).collect();
        let options = &self.config.options;
        let packing = pack(&lengths, options)?;
        let bins = packing.bin_offsets.windows(2).map(|w| {
            let members = &packing.indices[w[0] as usize..w[1] as usize];
            members.iter().map(|&i| self.buffer[i as usize])
        });
        let mut bins: Vec<(u64, Vec<StreamSegment>)> = bins
            .zip(&packing.bin_tokens)
            .map(|(segments, &tokens)| (tokens as u64, segments.collect()))
            .collect();
        // Fullest first, ties by bin number: a total order.
        bins.sort_by_key(|(tokens, _)| std::cmp::Reverse(*tokens));
        let mut leaving = bins.len();
        if !everything {
            let (numerator, denominator) = FULL_ENOUGH;
            let keep_limit = self.config.buffer_size / 2;
            let mut kept = 0;
            while let Some((tokens, segments)) = leaving.checked_sub(1).map(|b| &bins[b]) {
                let full_enough = tokens * denominator >= options.max_tokens * numerator;
                if full_enough || kept + segments.len() > keep_limit {
                    break;
                }
                kept += segments.len();
                leaving -= 1;
            }
        }
        let staying = bins.split_off(leaving);
        self.buffer = staying.into_iter().flat_map(|(_, s)| s).collect();
        let mut left: Vec<Vec<StreamSegment>> = bins.into_iter().map(|(_, s)| s).collect();
        if self.config.shuffle && left.len() > 1 {
            let seed = mix_seed(&[options.seed, self.config.shard, self.round]);
            SplitMix64::new(seed).shuffle(&mut left);
        }
        for segments in &mut left {
            segments.sort_unstable();
        }
        self.pending.extend(left);
        self.round += 1;
        Ok(())
    }

    /// The next bin, in stream order inside; `None` until a packing makes more.
    pub fn take_bin(&mut self) -> Option<TakenBin> {
        let segments = self.pending.pop_front()?;
        self.yielded_bins += 1;
        let mut released = Vec::new();
        for segment in &segments {
            if let Some(count) = self.held.get_mut(&segment.position) {
                *count -= 1;
                if *count == 0 {
                    self.held.remove(&segment.position);
                    released.push(segment.position);
                }
            }
        }
        Some(TakenBin { segments, released })
    }

    /// Positions of the items with segments held (buffered or pending), increasing.
    pub fn held_positions(&self) -> Vec<u64> {
        let mut positions: Vec<u64> = self.held.keys().copied().collect();
        positions.sort_unstable();
        positions
    }

    /// The next stream position this shard reads.
    pub fn next_position(&self) -> u64 {
        self.next_position
    }

    /// Items left out so far.
    pub fn dropped_seqs(&self) -> u64 {
        self.dropped_seqs
    }

    /// Bins taken so far.
    pub fn yielded_bins(&self) -> u64 {
        self.yielded_bins
    }

    /// Where this buffer stands.
    pub fn state(&self) -> StreamState {
        StreamState {
            next_position: self.next_position,
            round: self.round,
            yielded_bins: self.yielded_bins,
            dropped_seqs: self.dropped_seqs,
            buffer: self.buffer.clone(),
            pending: self.pending.iter().cloned().collect(),
        }
    }

    /// A buffer that continues from `state`, checked against this configuration.
    pub fn restore(config: StreamConfig, state: StreamState) -> Result<Self> {
        check_state(&config, &state)?;
        let mut held = HashMap::new();
        for segment in state.buffer.iter().chain(state.pending.iter().flatten()) {
            *held.entry(segment.position).or_insert(0) += 1;
        }
        Ok(Self {
            config,
            next_position: state.next_position,
            round: state.round,
            yielded_bins: state.yielded_bins,
            dropped_seqs: state.dropped_seqs,
            buffer: state.buffer,
            pending: state.pending.into(),
            held,
        })
    }
}

/// Refuse a state this configuration could not have produced.
fn check_state(config: &StreamConfig, state: &StreamState) -> Result<()> {
    let malformed =
        |message: String| Err(Error::invalid(format!("malformed stream state: {message}")));
    let StreamConfig {
        num_shards, shard, ..
    } = *config;
    let capacity = config.options.capacity();
    if state.next_position % num_shards != shard {
        return malformed(format!(
            "next_position {} is not a position of shard {shard} of {num_shards}",
            state.next_position
        ));
    }
    if state.buffer.len() >= config.buffer_size {
        return malformed(format!(
            "{} buffered segments, but a buffer of {} is packed when full",
            state.buffer.len(),
            config.buffer_size
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for segment in state.buffer.iter().chain(state.pending.iter().flatten()) {
        let StreamSegment {
            position,
            start,
            length,
        } = *segment;
        if position % num_shards != shard || position >= state.next_position {
            return malformed(format!(
                "segment ({position}, {start}, {length}) is not at a position of shard \
                 {shard} of {num_shards} read before next_position {}",
                state.next_position
            ));
        }
        if length > capacity || start.checked_add(length).is_none() {
            return malformed(format!(
                "segment ({position}, {start}, {length}) is longer than max_tokens={capacity}"
            ));
        }
        if !seen.insert((position, start)) {
            return malformed(format!(
                "segment ({position}, {start}, {length}) appears twice"
            ));
        }
    }
    for segments in &state.pending {
        let tokens: u64 = segments.iter().map(|s| s.length).sum();
        if segments.is_empty()
            || tokens > config.options.max_tokens
            || segments.len() as u64 > config.options.max_seqs
        {
            return malformed(format!(
                "a pending bin of {} segments and {tokens} tokens does not fit a bin",
                segments.len()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn config(max_tokens: i64, buffer_size: i64, oversize: &str, shuffle: bool) -> StreamConfig {
        StreamConfig::new(
            max_tokens,
            buffer_size,
            "bfd",
            None,
            oversize,
            shuffle,
            3,
            1,
            0,
        )
        .unwrap()
    }

    /// Push every length, taking bins as they come; returns the bins.
    fn run(buffer: &mut StreamBuffer, lengths: &[i64], first: u64) -> Vec<Vec<StreamSegment>> {
        let mut bins = Vec::new();
        let step = buffer.config.num_shards;
        for (i, &length) in lengths.iter().enumerate() {
            buffer.push(first + i as u64 * step, length).unwrap();
            if buffer.is_full() {
                buffer.repack().unwrap();
            }
            while let Some(bin) = buffer.take_bin() {
                bins.push(bin.segments);
            }
        }
        buffer.finish().unwrap();
        while let Some(bin) = buffer.take_bin() {
            bins.push(bin.segments);
        }
        bins
    }

    #[test]
    fn oversize_items_go_through_the_packing_splitter() {
        let lengths = [5i64, 30, 7, 12, 0];
        let mut split = StreamBuffer::new(config(10, 4, "split", false));
        let bins = run(&mut split, &lengths, 0);
        let mut pieces: Vec<StreamSegment> = bins.into_iter().flatten().collect();
        pieces.sort_unstable();
        let triples: Vec<(u64, u64, u64)> = pieces
            .iter()
            .map(|s| (s.position, s.start, s.length))
            .collect();
        assert_eq!(
            triples,
            [
                (0, 0, 5),
                (1, 0, 10),
                (1, 10, 10),
                (1, 20, 10),
                (2, 0, 7),
                (3, 0, 10),
                (3, 10, 2),
                (4, 0, 0)
            ]
        );
        let mut dropped = StreamBuffer::new(config(10, 4, "drop", false));
        let kept: usize = run(&mut dropped, &lengths, 0).iter().map(Vec::len).sum();
        assert_eq!((kept, dropped.dropped_seqs()), (3, 2));
        let mut refused = StreamBuffer::new(config(10, 4, "error", false));
        refused.push(0, 3).unwrap();
        let error = refused.push(1, 20).unwrap_err();
        assert!(matches!(
            error,
            Error::Oversize {
                index: 1,
                length: 20,
                ..
            }
        ));
        assert!(error.to_string().starts_with("sequence 1 has 20 tokens"));
    }

    #[test]
    fn pushes_out_of_shard_or_order_and_bad_states_are_refused() {
        let config = StreamConfig::new(10, 4, "bfd", None, "split", true, 0, 3, 1).unwrap();
        let mut buffer = StreamBuffer::new(config.clone());
        assert!(buffer.push(0, 3).is_err());
        buffer.push(4, 3).unwrap();
        assert!(buffer.push(1, 3).is_err());
        assert!(buffer.push(7, -1).is_err());
        let good = buffer.state();
        assert!(StreamBuffer::restore(config.clone(), good.clone()).is_ok());
        let segment = |position, start, length| StreamSegment {
            position,
            start,
            length,
        };
        for bad in [
            StreamState {
                buffer: vec![segment(10, 0, 3)],
                ..good.clone()
            },
            StreamState {
                buffer: vec![segment(3, 0, 3)],
                ..good.clone()
            },
            StreamState {
                buffer: vec![segment(4, 0, 11)],
                ..good.clone()
            },
            StreamState {
                pending: vec![vec![segment(4, 0, 6), segment(1, 0, 6)]],
                ..good.clone()
            },
            StreamState {
                pending: vec![vec![]],
                ..good.clone()
            },
            StreamState {
                buffer: vec![segment(4, 0, 3)],
                pending: vec![vec![segment(4, 0, 3)]],
                ..good.clone()
            },
            StreamState {
                next_position: 8,
                ..good.clone()
            },
        ] {
            let error = StreamBuffer::restore(config.clone(), bad.clone()).unwrap_err();
            assert!(
                error.to_string().starts_with("malformed stream state"),
                "{bad:?}"
            );
        }
        assert!(StreamConfig::new(10, 1, "bfd", None, "split", true, 0, 1, 0).is_err());
        assert!(StreamConfig::new(10, 4, "bfd", None, "split", true, 0, 2, 2).is_err());
    }

    proptest! {
        #[test]
        fn every_token_once_within_budget_and_a_restored_buffer_continues_exactly(
            lengths in prop::collection::vec(prop_oneof![0i64..40, 0i64..400], 0..200),
            max_tokens in 1i64..128,
            buffer_size in 2i64..40,
            max_seqs in prop::option::of(1i64..6),
            shuffle in any::<bool>(),
            cut in 0usize..200,
        ) {
            let config = StreamConfig::new(
                max_tokens, buffer_size, "bfd", max_seqs, "split", shuffle, 9, 1, 0,
            ).unwrap();
            let bins = run(&mut StreamBuffer::new(config.clone()), &lengths, 0);
            let mut covered = vec![0i64; lengths.len()];
            for bin in &bins {
                prop_assert!(!bin.is_empty());
                prop_assert!(bin.iter().map(|s| s.length).sum::<u64>() <= max_tokens as u64);
                prop_assert!(max_seqs.is_none_or(|m| bin.len() as i64 <= m));
                prop_assert!(bin.windows(2).all(|w| w[0] < w[1]), "stream order in a bin");
                for s in bin {
                    covered[s.position as usize] += s.length as i64;
                }
            }
            prop_assert_eq!(&covered, &lengths);

            // Stop after `cut` bins, save, restore, continue: the same bins.
            let mut first = StreamBuffer::new(config.clone());
            let mut taken = Vec::new();
            let mut next = 0;
            while taken.len() < cut.min(bins.len()) {
                if let Some(bin) = first.take_bin() {
                    taken.push(bin.segments);
                    continue;
                }
                if next == lengths.len() {
                    first.finish().unwrap();
                    continue;
                }
                first.push(next as u64, lengths[next]).unwrap();
                next += 1;
                if first.is_full() {
                    first.repack().unwrap();
                }
            }
            let state = first.state();
            prop_assert!(state.buffer.len() < buffer_size as usize);
            let mut resumed = StreamBuffer::restore(config, state).unwrap();
            let mut rest = Vec::new();
            while let Some(bin) = resumed.take_bin() {
                rest.push(bin.segments);
            }
            rest.extend(run(&mut resumed, &lengths[next..], next as u64));
            taken.extend(rest);
            prop_assert_eq!(taken, bins);
        }
    }
}
