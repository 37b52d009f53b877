//! [`Extremes`]: the min / max / mean statistics TRL logs for a stream of values.

/// Minimum, maximum and mean of a stream of values, mergeable across micro-batches
/// (0 for an empty stream, as TRL logs it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Extremes {
    min: f64,
    max: f64,
    sum: f64,
    count: f64,
}

impl Default for Extremes {
    fn default() -> Self {
        Self {
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            sum: 0.0,
            count: 0.0,
        }
    }
}

impl Extremes {
    /// As four numbers (for a gather across processes); [`Extremes::from_array`] reads
    /// them back.
    pub fn to_array(&self) -> [f64; 4] {
        [self.min, self.max, self.sum, self.count]
    }
    pub fn from_array(a: [f64; 4]) -> Self {
        Self {
            min: a[0],
            max: a[1],
            sum: a[2],
            count: a[3],
        }
    }
    pub fn push(&mut self, x: f64) {
        self.min = self.min.min(x);
        self.max = self.max.max(x);
        self.sum += x;
        self.count += 1.0;
    }
    pub fn merge(&mut self, o: &Extremes) {
        self.min = self.min.min(o.min);
        self.max = self.max.max(o.max);
        self.sum += o.sum;
        self.count += o.count;
    }
    pub fn count(&self) -> f64 {
        self.count
    }
    pub fn min(&self) -> f64 {
        if self.count > 0.0 {
            self.min
        } else {
            0.0
        }
    }
    pub fn max(&self) -> f64 {
        if self.count > 0.0 {
            self.max
        } else {
            0.0
        }
    }
    pub fn mean(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count
        } else {
            0.0
        }
    }
}
