//! Float arithmetic of the estimate's inner loops, exact and without branches: the
//! estimate is evaluated for millions of configurations at once, where a libm call or a
//! mispredicted branch is a large share of a cell's time.

/// 2^52: every double at least this large in magnitude is a whole number.
pub(crate) const TWO_POW_52: f64 = 4_503_599_627_370_496.0;

/// Whether `x` is a whole number in `[low, high]` (`0 <= low`, `high` finite), without
/// branches or conversions (a grid checks every value of a list of configurations):
/// below 2^52, adding and removing 2^52 rounds `x` to an integer (it changes only a
/// fractional `x`); from 2^52 on every double is whole. NaN fails every comparison.
#[inline(always)]
pub(crate) fn is_whole_in(x: f64, low: f64, high: f64) -> bool {
    let whole = (x >= TWO_POW_52) | ((x + TWO_POW_52) - TWO_POW_52 == x);
    (x >= low) & (x <= high) & whole
}

/// `x.ceil()`, without a rounding instruction (portable x86-64 has none, and `f64::ceil`
/// is a libm call, a tenth of the grid's time) nor a branch (whether a byte count is whole
/// varies from cell to cell): below 2^52 in magnitude, adding and removing 2^52 (with the
/// sign of `x`) rounds `x` to the nearest integer, one is added where that is below `x`;
/// from 2^52 on, every double is whole. Zero and negative zero give zero, as the integer
/// round trip this replaces did.
#[inline(always)]
pub(crate) fn ceil(x: f64) -> f64 {
    let shift = TWO_POW_52.copysign(x);
    let nearest = (x + shift) - shift;
    let up = nearest + if nearest < x { 1.0 } else { 0.0 };
    if x.abs() < TWO_POW_52 {
        up
    } else {
        x
    }
}

/// A count below 2^32 (stages, chunks and layers of a pipeline: at most 4,095) as an
/// `f64`, by the one-instruction signed conversion rather than the unsigned 64-bit one.
#[inline(always)]
pub(crate) fn count(n: u64) -> f64 {
    f64::from(n as u32)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `ceil` is `f64::ceil`, except that what rounds up to zero is +0.0 (as the byte
    /// counts' integer round trip gave).
    fn expected_ceil(x: f64) -> f64 {
        let c = x.ceil();
        if c == 0.0 {
            0.0
        } else {
            c
        }
    }

    #[test]
    fn ceil_of_edge_values() {
        let edges = [
            0.0,
            -0.0,
            0.5,
            -0.5,
            1.0,
            1.5,
            2.5,
            -2.5,
            TWO_POW_52 - 0.5,
            TWO_POW_52,
            TWO_POW_52 + 1.0,
            -TWO_POW_52 + 0.5,
            2f64.powi(63),
            9.0e18,
            1e300,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        for x in edges {
            assert_eq!(ceil(x).to_bits(), expected_ceil(x).to_bits(), "{x}");
        }
        assert!(ceil(f64::NAN).is_nan());
    }

    proptest! {
        #[test]
        fn ceil_is_the_ceiling(x in any::<f64>(), whole in -(1i64 << 53)..(1i64 << 53)) {
            prop_assume!(!x.is_nan());
            prop_assert_eq!(ceil(x).to_bits(), expected_ceil(x).to_bits());
            let near = whole as f64;
            for y in [near, near + 0.25, near - 0.25, near / 3.0, near * 1e-9] {
                prop_assert_eq!(ceil(y).to_bits(), expected_ceil(y).to_bits(), "{}", y);
            }
        }
    }
}
