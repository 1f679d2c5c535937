//! Target token shares of the sources as a function of the tokens consumed so far.

use std::str::FromStr;

use crate::error::{Error, Result};

/// How shares change between two change points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// A change point's shares hold until the next one.
    Constant,
    /// Shares move linearly from one change point's to the next one's.
    Linear,
}

impl Interpolation {
    /// The name Python uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Constant => "constant",
            Self::Linear => "linear",
        }
    }
}

impl FromStr for Interpolation {
    type Err = Error;

    fn from_str(name: &str) -> Result<Self> {
        match name {
            "constant" => Ok(Self::Constant),
            "linear" => Ok(Self::Linear),
            other => Err(Error::invalid(format!(
                "interpolation must be 'constant' or 'linear', got '{other}'"
            ))),
        }
    }
}

/// How far a row of shares may sum away from 1 (decimal shares such as 0.7/0.2/0.1 do
/// not sum to exactly 1 in binary floating point).
const SUM_TOLERANCE: f64 = 1e-6;

/// Shares of `n_sources` sources at change points of consumed tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ShareSchedule {
    /// Consumed tokens at which each row starts to hold: 0 first, increasing.
    points: Vec<u64>,
    /// `points.len() x n_sources` shares, row-major; every row non-negative, summing to 1.
    shares: Vec<f64>,
    n_sources: usize,
    interpolation: Interpolation,
}

impl ShareSchedule {
    /// Check and build a schedule: `points` start at 0 and increase; `shares` holds one
    /// row of `n_sources` non-negative shares summing to 1 per point.
    pub fn new(
        points: &[i64],
        shares: &[f64],
        n_sources: usize,
        interpolation: Interpolation,
    ) -> Result<Self> {
        if n_sources == 0 {
            return Err(Error::invalid("a mixture needs at least one source"));
        }
        if points.is_empty() || shares.len() != points.len() * n_sources {
            return Err(Error::invalid(format!(
                "a share schedule needs one row of {n_sources} shares per change point, got \
                 {} shares for {} points",
                shares.len(),
                points.len()
            )));
        }
        if points[0] != 0 {
            return Err(Error::invalid(format!(
                "the first change point of a share schedule must be at 0 tokens, got {}",
                points[0]
            )));
        }
        if let Some(pair) = points.windows(2).find(|pair| pair[1] <= pair[0]) {
            return Err(Error::invalid(format!(
                "change points of a share schedule must increase, got {} then {}",
                pair[0], pair[1]
            )));
        }
        for (row, values) in shares.chunks_exact(n_sources).enumerate() {
            if let Some(bad) = values.iter().find(|v| !v.is_finite() || **v < 0.0) {
                return Err(Error::invalid(format!(
                    "shares must be non-negative numbers, got {bad} at change point {}",
                    points[row]
                )));
            }
            let sum: f64 = values.iter().sum();
            if (sum - 1.0).abs() > SUM_TOLERANCE {
                return Err(Error::invalid(format!(
                    "shares must sum to 1, got {sum} at change point {}",
                    points[row]
                )));
            }
        }
        Ok(Self {
            points: points.iter().map(|&p| p as u64).collect(),
            shares: shares.to_vec(),
            n_sources,
            interpolation,
        })
    }

    /// Number of sources.
    pub fn n_sources(&self) -> usize {
        self.n_sources
    }

    /// Change points, in consumed tokens.
    pub fn points(&self) -> &[u64] {
        &self.points
    }

    /// Shares of every change point, row-major.
    pub fn shares(&self) -> &[f64] {
        &self.shares
    }

    /// How shares change between change points.
    pub fn interpolation(&self) -> Interpolation {
        self.interpolation
    }

    fn row(&self, index: usize) -> &[f64] {
        &self.shares[index * self.n_sources..(index + 1) * self.n_sources]
    }

    /// Shares after `consumed` tokens.
    pub fn at(&self, consumed: u64) -> Vec<f64> {
        // The last change point at or before `consumed` (the first is 0).
        let index = self.points.partition_point(|&p| p <= consumed) - 1;
        let row = self.row(index);
        match (self.interpolation, self.points.get(index + 1)) {
            (Interpolation::Linear, Some(&next)) => {
                let start = self.points[index];
                let t = (consumed - start) as f64 / (next - start) as f64;
                row.iter()
                    .zip(self.row(index + 1))
                    .map(|(&a, &b)| a + (b - a) * t)
                    .collect()
            }
            _ => row.to_vec(),
        }
    }
}
