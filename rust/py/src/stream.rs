//! Bindings of `tokenbatch_core::packing::stream`: the buffer behind `tokenbatch.StreamPacker`.

use pyo3::prelude::*;
use tokenbatch_core::packing::stream::{
    StreamBuffer, StreamConfig, StreamSegment, StreamState, TakenBin, STREAM_STATE_VERSION,
};

use crate::error::{guard, IntoPyResult};
use crate::parallel::detach_parallel;

/// A segment as Python sees it: `(position, start, length)`.
type Segment = (u64, u64, u64);

fn to_py(segment: &StreamSegment) -> Segment {
    (segment.position, segment.start, segment.length)
}

fn from_py(&(position, start, length): &Segment) -> StreamSegment {
    StreamSegment {
        position,
        start,
        length,
    }
}

/// The buffer of a stream packer: admits items, packs when full, hands out bins.
#[pyclass(module = "tokenbatch._core", name = "StreamBuffer")]
pub struct PyStreamBuffer {
    inner: StreamBuffer,
}

/// A bin taken from the buffer.
#[pyclass(module = "tokenbatch._core", name = "StreamBin", frozen)]
pub struct PyStreamBin {
    /// `(position, start, length)` of its segments, in stream order.
    #[pyo3(get)]
    segments: Vec<Segment>,
    /// Positions of the items none of whose segments is held any more.
    #[pyo3(get)]
    released: Vec<u64>,
}

impl From<TakenBin> for PyStreamBin {
    fn from(bin: TakenBin) -> Self {
        Self {
            segments: bin.segments.iter().map(to_py).collect(),
            released: bin.released,
        }
    }
}

#[pymethods]
impl PyStreamBuffer {
    /// Version of the packer's behaviour and state format.
    #[classattr]
    const STATE_VERSION: u32 = STREAM_STATE_VERSION;

    #[new]
    #[pyo3(signature = (max_tokens, *, buffer_size, algorithm, max_seqs, oversize, shuffle, seed, num_shards, shard))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        max_tokens: i64,
        buffer_size: i64,
        algorithm: &str,
        max_seqs: Option<i64>,
        oversize: &str,
        shuffle: bool,
        seed: u64,
        num_shards: i64,
        shard: i64,
    ) -> PyResult<Self> {
        guard("StreamBuffer.__new__", || {
            let config = StreamConfig::new(
                max_tokens,
                buffer_size,
                algorithm,
                max_seqs,
                oversize,
                shuffle,
                seed,
                num_shards,
                shard,
            )
            .into_py_result()?;
            Ok(Self {
                inner: StreamBuffer::new(config),
            })
        })
    }

    /// Admit the item at `position` with `length` tokens; returns how many segments it
    /// became (0: dropped). Packs the buffer when that fills it.
    fn push(&mut self, py: Python<'_>, position: u64, length: i64) -> PyResult<u64> {
        guard("StreamBuffer.push", || {
            let segments = self.inner.push(position, length).into_py_result()?;
            if self.inner.is_full() {
                let inner = &mut self.inner;
                detach_parallel(py, || inner.repack()).into_py_result()?;
            }
            Ok(segments)
        })
    }

    /// The stream ended: pack what is left; every bin leaves.
    fn finish(&mut self, py: Python<'_>) -> PyResult<()> {
        guard("StreamBuffer.finish", || {
            let inner = &mut self.inner;
            detach_parallel(py, || inner.finish()).into_py_result()
        })
    }

    /// The next bin, or `None` until a packing makes more.
    fn take_bin(&mut self) -> PyResult<Option<PyStreamBin>> {
        guard("StreamBuffer.take_bin", || {
            Ok(self.inner.take_bin().map(PyStreamBin::from))
        })
    }

    /// Positions of the items with segments held, increasing.
    fn held_positions(&self) -> PyResult<Vec<u64>> {
        guard("StreamBuffer.held_positions", || {
            Ok(self.inner.held_positions())
        })
    }

    /// The next stream position this shard reads.
    #[getter]
    fn next_position(&self) -> u64 {
        self.inner.next_position()
    }

    /// Items left out so far.
    #[getter]
    fn dropped_seqs(&self) -> u64 {
        self.inner.dropped_seqs()
    }

    /// Bins taken so far.
    #[getter]
    fn yielded_bins(&self) -> u64 {
        self.inner.yielded_bins()
    }

    /// The state as a dict of plain values (`next_position`, `round`, `yielded_bins`,
    /// `dropped_seqs`, `buffer`, `pending`).
    fn state<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        guard("StreamBuffer.state", || {
            let state = self.inner.state();
            let dict = pyo3::types::PyDict::new(py);
            dict.set_item("next_position", state.next_position)?;
            dict.set_item("round", state.round)?;
            dict.set_item("yielded_bins", state.yielded_bins)?;
            dict.set_item("dropped_seqs", state.dropped_seqs)?;
            let buffer: Vec<Segment> = state.buffer.iter().map(to_py).collect();
            dict.set_item("buffer", buffer)?;
            let pending: Vec<Vec<Segment>> = state
                .pending
                .iter()
                .map(|bin| bin.iter().map(to_py).collect())
                .collect();
            dict.set_item("pending", pending)?;
            Ok(dict)
        })
    }

    /// Continue from a state of `state()`'s form, checked against this configuration.
    #[pyo3(signature = (*, next_position, round, yielded_bins, dropped_seqs, buffer, pending))]
    fn restore(
        &mut self,
        next_position: u64,
        round: u64,
        yielded_bins: u64,
        dropped_seqs: u64,
        buffer: Vec<Segment>,
        pending: Vec<Vec<Segment>>,
    ) -> PyResult<()> {
        guard("StreamBuffer.restore", || {
            let state = StreamState {
                next_position,
                round,
                yielded_bins,
                dropped_seqs,
                buffer: buffer.iter().map(from_py).collect(),
                pending: pending
                    .iter()
                    .map(|bin| bin.iter().map(from_py).collect())
                    .collect(),
            };
            self.inner =
                StreamBuffer::restore(self.inner.config().clone(), state).into_py_result()?;
            Ok(())
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyStreamBuffer>()?;
    m.add_class::<PyStreamBin>()?;
    Ok(())
}
