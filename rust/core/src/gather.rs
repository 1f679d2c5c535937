//! Copying packed segments out of a value buffer: the assembly step of packing a dataset.
//!
//! A packed dataset's token column is the concatenation, in packing order, of the
//! segments `values[start .. start + length]` of the source column. Copying whole
//! segments in parallel moves memory at memcpy speed, where a gather through a per-token
//! index array first writes, then reads, an index as long as the token stream.

use rayon::prelude::*;

use crate::error::{Error, Result};

/// Output elements a worker copies at a time (a few hundred KB: cache-friendly, and
/// enough blocks to balance two to a few dozen threads).
const BLOCK: usize = 1 << 16;

/// Concatenate `values[starts[i] .. starts[i] + lengths[i]]` for every `i`, in order.
///
/// `T` is any plain element type; the Python side passes every fixed-width dtype as the
/// unsigned integer of its width.
pub fn gather_segments<T>(values: &[T], starts: &[i64], lengths: &[i64]) -> Result<Vec<T>>
where
    T: Copy + Send + Sync,
{
    if starts.len() != lengths.len() {
        return Err(Error::invalid(format!(
            "{} segment starts but {} lengths",
            starts.len(),
            lengths.len()
        )));
    }
    // Output offset of each segment, checking each segment against the source.
    let mut offsets = Vec::with_capacity(starts.len() + 1);
    let mut total = 0usize;
    offsets.push(0);
    for (i, (&start, &length)) in starts.iter().zip(lengths).enumerate() {
        let (Ok(first), Ok(count)) = (usize::try_from(start), usize::try_from(length)) else {
            return Err(Error::invalid(format!(
                "segment {i} has start {start} and length {length}; both must be >= 0"
            )));
        };
        if first
            .checked_add(count)
            .is_none_or(|end| end > values.len())
        {
            return Err(Error::invalid(format!(
                "segment {i} ({start}..{start}+{length}) reaches past the {} source values",
                values.len()
            )));
        }
        total = total
            .checked_add(count)
            .ok_or_else(|| Error::overflow("the segments hold more values than fit in memory"))?;
        offsets.push(total);
    }
    let mut out: Vec<T> = Vec::new();
    out.try_reserve_exact(total).map_err(|_| {
        Error::overflow(format!(
            "no memory for the {total} values of {} segments",
            starts.len()
        ))
    })?;
    // Written once, straight from the source: no zeroing pass over fresh memory. Not
    // advised for huge pages: where free memory is fragmented the kernel compacts memory
    // on each 2 MiB fault, which makes the first call, the common one, slow and uneven.
    // Blocks of whole segments, each owning its part of the output.
    let mut blocks = Vec::new();
    let mut rest = &mut out.spare_capacity_mut()[..total];
    let mut first = 0;
    while first < starts.len() {
        let limit = offsets[first] + BLOCK;
        // The first segment, then every following one that still ends within the block.
        let end = first + 1 + offsets[first + 2..].partition_point(|&o| o <= limit);
        let (head, tail) = rest.split_at_mut(offsets[end] - offsets[first]);
        blocks.push((first..end, head));
        rest = tail;
        first = end;
    }
    blocks.into_par_iter().for_each(|(segments, mut dest)| {
        for i in segments {
            // Validated above: both conversions hold and the range is inside `values`.
            let (start, length) = (starts[i] as usize, lengths[i] as usize);
            let (head, tail) = dest.split_at_mut(length);
            // (`write_copy_of_slice` is newer than the MSRV; this loop compiles to memcpy.)
            for (slot, &value) in head.iter_mut().zip(&values[start..start + length]) {
                slot.write(value);
            }
            dest = tail;
        }
    });
    // SAFETY: the blocks partition the first `total` elements of the spare capacity
    // (their lengths add up to `offsets[n] - offsets[0] = total`), and each block wrote
    // every element of its part, so all `total` elements are initialized.
    unsafe { out.set_len(total) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn naive(values: &[u32], starts: &[i64], lengths: &[i64]) -> Vec<u32> {
        starts
            .iter()
            .zip(lengths)
            .flat_map(|(&s, &l)| values[s as usize..(s + l) as usize].iter().copied())
            .collect()
    }

    proptest! {
        #[test]
        fn equals_concatenating_the_slices(
            n in 0usize..100_000,
            segments in prop::collection::vec((0.0f64..1.0, 0usize..40_000), 0..60),
        ) {
            let values: Vec<u32> = (0..n as u32).collect();
            let (mut starts, mut lengths) = (Vec::new(), Vec::new());
            for (at, length) in segments {
                let start = ((at * n as f64) as usize).min(n);
                starts.push(start as i64);
                lengths.push(length.min(n - start) as i64);
            }
            let out = gather_segments(&values, &starts, &lengths).unwrap();
            prop_assert_eq!(out, naive(&values, &starts, &lengths));
        }
    }

    #[test]
    fn many_small_segments_cross_blocks() {
        let values: Vec<u64> = (0..1_000_000).collect();
        let starts: Vec<i64> = (0..200_000).map(|i| (i * 4_999) % 999_990).collect();
        let lengths: Vec<i64> = (0..200_000).map(|i| i % 11).collect();
        let out = gather_segments(&values, &starts, &lengths).unwrap();
        let expected: Vec<u64> = starts
            .iter()
            .zip(&lengths)
            .flat_map(|(&s, &l)| (s..s + l).map(|v| v as u64))
            .collect();
        assert!(out.len() > 2 * BLOCK);
        assert_eq!(out, expected);
    }

    #[test]
    fn bad_segments_are_errors() {
        let values = [1u8, 2, 3];
        assert!(gather_segments(&values, &[0], &[]).is_err());
        assert!(gather_segments(&values, &[-1], &[1]).is_err());
        assert!(gather_segments(&values, &[0], &[-1]).is_err());
        assert!(gather_segments(&values, &[2], &[2]).is_err());
        assert!(gather_segments(&values, &[i64::MAX], &[i64::MAX]).is_err());
        assert_eq!(
            gather_segments(&values, &[2, 0], &[1, 2]).unwrap(),
            vec![3, 1, 2]
        );
        assert!(gather_segments(&values, &[], &[]).unwrap().is_empty());
    }
}
