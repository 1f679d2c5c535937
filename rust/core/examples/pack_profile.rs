//! Time `pack` on 10M log-normal lengths: `cargo run --release --example pack_profile [algorithm...]`.
use std::time::{Duration, Instant};
use tokenbatch_core::packing::{pack, PackOptions};
use tokenbatch_core::rng::SplitMix64;

fn main() -> Result<(), tokenbatch_core::Error> {
    let n: usize = std::env::var("N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let mut rng = SplitMix64::new(1);
    let mut uniform = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    // Approximately log-normal(6.5, 1): a sum of four uniforms stands in for the normal.
    let lengths: Vec<i64> = (0..n)
        .map(|_| {
            let z = ((0..4).map(|_| uniform()).sum::<f64>() - 2.0) * 1.7;
            ((6.5 + z).exp() as i64).clamp(1, 8192)
        })
        .collect();
    let algorithms: Vec<String> = std::env::args().skip(1).collect();
    let algorithms = if algorithms.is_empty() {
        vec!["bfd".to_string()]
    } else {
        algorithms
    };
    for algorithm in algorithms {
        let options = PackOptions::new(8192, None, 1, "error", &algorithm, 0)?;
        let mut best = Duration::MAX;
        let mut n_bins = 0;
        for _ in 0..5 {
            let start = Instant::now();
            let packing = pack(&lengths, &options)?;
            best = best.min(start.elapsed());
            n_bins = packing.n_bins();
        }
        println!("{algorithm}: best of 5 {best:?}, {n_bins} bins");
    }
    Ok(())
}
