//! Latency samples and their summary (pure).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

/// Samples per RPC method, in microseconds.
#[derive(Default, Debug, Clone)]
pub struct Samples(BTreeMap<&'static str, Vec<u32>>);

impl Samples {
    pub fn add(&mut self, method: &'static str, took: Duration) {
        let us = took.as_micros().min(u32::MAX as u128) as u32;
        self.0.entry(method).or_default().push(us);
    }

    pub fn merge(&mut self, other: Samples) {
        for (m, v) in other.0 {
            self.0.entry(m).or_default().extend(v);
        }
    }

    pub fn count(&self) -> usize {
        self.0.values().map(Vec::len).sum()
    }

    pub fn summary(&self) -> Vec<MethodSummary> {
        self.0
            .iter()
            .map(|(m, v)| MethodSummary::of(m, v))
            .collect()
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MethodSummary {
    pub method: String,
    pub calls: usize,
    pub p50_us: u32,
    pub p99_us: u32,
    pub max_us: u32,
    pub mean_us: f64,
}

impl MethodSummary {
    pub fn of(method: &str, samples: &[u32]) -> Self {
        let mut v = samples.to_vec();
        v.sort_unstable();
        let mean = if v.is_empty() {
            0.0
        } else {
            v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64
        };
        Self {
            method: method.to_string(),
            calls: v.len(),
            p50_us: percentile(&v, 50.0),
            p99_us: percentile(&v, 99.0),
            max_us: v.last().copied().unwrap_or(0),
            mean_us: (mean * 10.0).round() / 10.0,
        }
    }
}

/// Nearest-rank percentile of sorted samples (0 for none).
pub fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn summaries_per_method_after_merge() {
        let mut a = Samples::default();
        a.add("Refresh", Duration::from_micros(300));
        let mut b = Samples::default();
        for us in [10, 20, 30, 40] {
            b.add("NodeGroupForNode", Duration::from_micros(us));
        }
        a.merge(b);
        assert_eq!(a.count(), 5);
        let s = a.summary();
        assert_eq!(s[0].method, "NodeGroupForNode");
        assert_eq!(
            (s[0].calls, s[0].p50_us, s[0].max_us, s[0].mean_us),
            (4, 20, 40, 25.0)
        );
        assert_eq!(s[1].p99_us, 300);
    }
}
