//! The numbers behind the charts: rolling means, axis ranges and stage changes.
use crate::run::log::TrainingLog;

/// Trailing rolling mean: element `i` is the mean of the finite values among
/// `values[i+1-window ..= i]` (fewer at the start), NaN where there are none.
pub fn rolling_mean(values: &[f64], window: usize) -> Vec<f64> {
    let window = window.max(1);
    (0..values.len())
        .map(|i| {
            let lo = (i + 1).saturating_sub(window);
            let (sum, n) = values[lo..=i]
                .iter()
                .filter(|v| v.is_finite())
                .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
            if n == 0 {
                f64::NAN
            } else {
                sum / n as f64
            }
        })
        .collect()
}

/// Rows where the stage changes: `(row index, new stage name)`; the first row is
/// never a boundary.
pub fn stage_boundaries(stages: &[String]) -> Vec<(usize, String)> {
    stages
        .windows(2)
        .enumerate()
        .filter(|(_, w)| w[0] != w[1])
        .map(|(i, w)| (i + 1, w[1].clone()))
        .collect()
}

/// `(lo, hi)` covering the finite values, padded so the range is never empty: 5% on
/// each side, or +-max(10% of |v|, 0.5) around a constant; (0, 1) with no finite value.
pub fn padded_range<'a>(values: impl IntoIterator<Item = &'a f64>) -> (f64, f64) {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    let span = hi - lo;
    if span <= f64::EPSILON * lo.abs().max(hi.abs()).max(1.0) {
        let pad = (lo.abs() * 0.1).max(0.5);
        return (lo - pad, hi + pad);
    }
    (lo - span * 0.05, hi + span * 0.05)
}

/// Runs of consecutive finite `(x, y)` points (lines break at NaN).
pub(super) fn finite_segments(xs: &[f64], ys: &[f64]) -> Vec<Vec<(f64, f64)>> {
    let mut segs = Vec::new();
    let mut cur = Vec::new();
    for (&x, &y) in xs.iter().zip(ys) {
        if x.is_finite() && y.is_finite() {
            cur.push((x, y));
        } else if !cur.is_empty() {
            segs.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        segs.push(cur);
    }
    segs
}

pub(super) fn step_range(steps: &[f64]) -> (f64, f64) {
    let first = steps.iter().copied().fold(f64::INFINITY, f64::min);
    let last = steps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !first.is_finite() {
        return (0.0, 1.0);
    }
    if last - first < 1.0 {
        // One row: a couple of steps either side.
        return (first - 2.0, last + 2.0);
    }
    let pad = ((last - first) * 0.02).max(0.5);
    (first - pad, last + pad)
}

/// Extra space above the data for the stage labels, when the log has stage changes.
pub(super) fn with_stage_headroom((lo, hi): (f64, f64), log: &TrainingLog) -> (f64, f64) {
    if stage_boundaries(&log.stages).is_empty() {
        (lo, hi)
    } else {
        (lo, hi + (hi - lo) * 0.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rolling_mean_by_hand() {
        let v = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(rolling_mean(&v, 1), v.to_vec());
        assert_eq!(rolling_mean(&v, 3), vec![1.0, 1.5, 2.0, 3.0, 4.0]);
        assert_eq!(rolling_mean(&v, 10), vec![1.0, 1.5, 2.0, 2.5, 3.0]);
        // NaNs are skipped; a window of only NaNs is NaN.
        let v = [f64::NAN, 2.0, f64::NAN, f64::NAN, 6.0];
        let m = rolling_mean(&v, 2);
        assert!(m[0].is_nan());
        assert_eq!(m[1], 2.0);
        assert_eq!(m[2], 2.0);
        assert!(m[3].is_nan());
        assert_eq!(m[4], 6.0);
        assert!(rolling_mean(&[], 3).is_empty());
        assert_eq!(rolling_mean(&[4.0, 8.0], 0), vec![4.0, 8.0]);
    }

    #[test]
    fn stage_boundaries_found() {
        let s: Vec<String> = ["a", "a", "b", "b", "b", "c", "a"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(
            stage_boundaries(&s),
            vec![(2, "b".into()), (5, "c".into()), (6, "a".into())]
        );
        assert!(stage_boundaries(&s[..2]).is_empty());
        assert!(stage_boundaries(&[]).is_empty());
    }

    #[test]
    fn ranges_are_never_degenerate() {
        assert_eq!(padded_range(&[f64::NAN, f64::NAN]), (0.0, 1.0));
        assert_eq!(padded_range(&[]), (0.0, 1.0));
        assert_eq!(padded_range(&[2.0, 2.0]), (1.5, 2.5));
        assert_eq!(padded_range(&[0.0]), (-0.5, 0.5));
        assert_eq!(padded_range(&[100.0]), (90.0, 110.0));
        let (lo, hi) = padded_range(&[0.0, f64::NAN, 10.0]);
        assert!((lo + 0.5).abs() < 1e-12 && (hi - 10.5).abs() < 1e-12);
        assert_eq!(step_range(&[7.0]), (5.0, 9.0));
    }

    #[test]
    fn segments_break_at_nan() {
        let xs = [1.0, 2.0, 3.0, 4.0, 5.0];
        let ys = [1.0, f64::NAN, 3.0, 4.0, f64::NAN];
        assert_eq!(
            finite_segments(&xs, &ys),
            vec![vec![(1.0, 1.0)], vec![(3.0, 3.0), (4.0, 4.0)]]
        );
    }
}
