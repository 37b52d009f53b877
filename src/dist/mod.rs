//! Data-parallel training across processes, on engines clusters already run: MPI
//! (feature `mpi`, rsmpi on the system's Open MPI or MPICH; `mpirun -np N` or `srun`)
//! and NCCL across GPUs (feature `nccl`, cudarc's bindings; torchrun-style or Slurm
//! variables). Both sit behind [`Collective`]; one process is [`Single`].
//!
//! The scheme (docs/distributed.md): every rank draws the step's prompts (a pure
//! function of the step seed), samples and scores its own contiguous block of them
//! with RNG streams keyed by the prompt's index in the step, never by rank, then the
//! scored groups are gathered so that every rank holds the whole batch. Advantages,
//! dynamic sampling's choice, the loss normalisers and the metrics are therefore
//! computed from the same numbers as in one process. Each rank trains its own rows;
//! the LoRA gradients are summed over the ranks before clipping, so AdamW takes the
//! same step everywhere and the replicas never drift. Rank 0 writes the run directory;
//! the others wait at a barrier.
//!
//! A peer that dies or hangs must not hang the others: every collective is watched
//! ([`Dist`]), and one that waits longer than `CONCORD_DIST_TIMEOUT` seconds (default
//! 1800) ends the process with an error naming the collective. mpirun, torchrun and
//! srun then stop the rest of the job.
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub mod launch;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "nccl")]
pub mod nccl;

pub use launch::Launch;

/// The three operations data parallel needs, over host buffers. Implementations:
/// [`Single`], `mpi::Mpi`, `nccl::Nccl`.
pub trait Collective {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Element-wise sum over the ranks, in place; every rank gets the same result.
    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()>;
    /// [`Collective::all_reduce_sum_f64`] for f32 (gradients).
    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()>;
    /// Every rank's `buf` becomes rank `root`'s (all ranks pass the same length).
    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    /// Sum tensors over the ranks. The default goes through one flat host buffer
    /// ([`all_reduce_tensors_on_host`]); NCCL keeps them on the GPU.
    fn all_reduce_tensors(&self, ts: &mut [Tensor]) -> Result<()> {
        all_reduce_tensors_on_host(self, ts)
    }
    /// End the whole job now (after this rank failed): the launcher stops the other
    /// ranks. Never returns.
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }
    /// `mpi (Open MPI v4.1.4)`, `nccl`, ...
    fn name(&self) -> String;
}

/// Sum tensors over the ranks of `c` through one flat host buffer (one collective call
/// for all of them), in f64: the trainer's gradient sums are f64 so that their total
/// does not depend on how the terms were split between processes.
pub fn all_reduce_tensors_on_host<C: Collective + ?Sized>(c: &C, ts: &mut [Tensor]) -> Result<()> {
    let mut flat = Vec::new();
    for t in ts.iter() {
        flat.extend(
            t.flatten_all()?
                .to_dtype(candle_core::DType::F64)?
                .to_vec1::<f64>()?,
        );
    }
    c.all_reduce_sum_f64(&mut flat)?;
    let mut at = 0;
    for t in ts.iter_mut() {
        let n = t.elem_count();
        let summed = Tensor::from_slice(&flat[at..at + n], t.shape(), t.device())?;
        *t = summed.to_dtype(t.dtype())?;
        at += n;
    }
    Ok(())
}

/// One process: every collective is the identity.
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum_f64(&self, _: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn all_reduce_sum_f32(&self, _: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn broadcast(&self, _: usize, _: &mut [u8]) -> Result<()> {
        Ok(())
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn name(&self) -> String {
        "single process".into()
    }
}

/// The default time a collective may wait for the other ranks.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1800);

/// The environment variable that sets it (seconds).
pub const TIMEOUT_VAR: &str = "CONCORD_DIST_TIMEOUT";

/// The trainer's handle on the process group: a [`Collective`] plus what every
/// collective call needs around it (the watchdog, the time spent communicating) and
/// the gathers built from the three operations. With one process every call returns
/// at once.
pub struct Dist {
    inner: Box<dyn Collective>,
    watchdog: Option<Watchdog>,
    /// Per collective: the seconds of each call (waiting for the slowest rank
    /// included). Every rank makes the same calls in the same order.
    spent: RefCell<BTreeMap<String, Vec<f64>>>,
}

impl Dist {
    /// One process.
    pub fn single() -> Self {
        Self::new(Box::new(Single), DEFAULT_TIMEOUT)
    }

    /// Over `inner`; a collective waiting longer than `timeout` ends the process.
    pub fn new(inner: Box<dyn Collective>, timeout: Duration) -> Self {
        let watchdog = (inner.world_size() > 1).then(|| Watchdog::start(inner.rank(), timeout));
        Self {
            inner,
            watchdog,
            spent: RefCell::new(BTreeMap::new()),
        }
    }

    /// The process group this process was launched into (see [`launch`]); one process
    /// when no launcher variables are set. `device` is the `[model] device`; an NCCL
    /// launch sets it to `cuda:LOCAL_RANK`.
    pub fn from_launch(device: &mut String) -> Result<Self> {
        let launch = Launch::from_env()?;
        if launch.world_size <= 1 {
            return Ok(Self::single());
        }
        let timeout = timeout_from_env()?;
        let inner = connect(&launch, device, timeout)?;
        Ok(Self::new(inner, timeout))
    }

    pub fn rank(&self) -> usize {
        self.inner.rank()
    }

    pub fn world_size(&self) -> usize {
        self.inner.world_size()
    }

    /// Rank 0: the one that writes the run directory and prints progress.
    pub fn is_root(&self) -> bool {
        self.rank() == 0
    }

    pub fn is_distributed(&self) -> bool {
        self.world_size() > 1
    }

    pub fn name(&self) -> String {
        self.inner.name()
    }

    /// Where the time in collectives went, over every rank (a collective itself, so
    /// every rank calls it): per collective, its calls, the sum over calls of the
    /// shortest rank's time (about the transfer alone: that rank arrived last and
    /// waited for nobody) and of the longest (the transfer plus waiting for the slowest
    /// rank).
    pub fn comm_report(&self) -> Result<Vec<CommTime>> {
        let mine = self.spent.borrow().clone();
        let all = self.all_gather_json("collective timings", &mine)?;
        Ok(mine
            .iter()
            .map(|(what, calls)| {
                let per_rank: Vec<&Vec<f64>> = all.iter().filter_map(|m| m.get(what)).collect();
                let on_call = |i: usize| per_rank.iter().filter_map(move |v| v.get(i).copied());
                CommTime {
                    what: what.clone(),
                    calls: calls.len(),
                    least_secs: (0..calls.len())
                        .map(|i| on_call(i).fold(f64::INFINITY, f64::min))
                        .sum(),
                    most_secs: (0..calls.len())
                        .map(|i| on_call(i).fold(0.0, f64::max))
                        .sum(),
                }
            })
            .collect())
    }

    /// This rank's contiguous share of `n` items (prompts of a step): the first
    /// `n % W` ranks take one more.
    pub fn block(&self, n: usize) -> Range<usize> {
        block(n, self.world_size(), self.rank())
    }

    /// Run one collective under the watchdog and the clock.
    fn watched<T>(&self, what: &str, f: impl FnOnce(&dyn Collective) -> Result<T>) -> Result<T> {
        let Some(w) = &self.watchdog else {
            return f(self.inner.as_ref());
        };
        let t = Instant::now();
        w.arm(what);
        let out = f(self.inner.as_ref()).with_context(|| format!("collective `{what}`"));
        w.disarm();
        let elapsed = t.elapsed().as_secs_f64();
        self.spent
            .borrow_mut()
            .entry(what.to_string())
            .or_default()
            .push(elapsed);
        out
    }

    /// Sum `buf` over the ranks, in place.
    pub fn all_reduce_sum(&self, what: &str, buf: &mut [f64]) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        self.watched(what, |c| c.all_reduce_sum_f64(buf))
    }

    /// Sum the gradients over the ranks, in place.
    pub fn all_reduce_grads(&self, grads: &mut [Tensor]) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        self.watched("gradient all-reduce", |c| c.all_reduce_tensors(grads))
    }

    /// Whether `flag` is set on any rank (every rank gets the same answer).
    pub fn any(&self, what: &str, flag: bool) -> Result<bool> {
        let mut v = [if flag { 1.0 } else { 0.0 }];
        self.all_reduce_sum(what, &mut v)?;
        Ok(v[0] > 0.0)
    }

    /// Every rank's `mine`, in rank order (this rank's included). Each value crosses
    /// unchanged: rank r's row of a zero-filled `W x n` buffer is summed with zeros.
    pub fn all_gather_f64(&self, what: &str, mine: &[f64]) -> Result<Vec<Vec<f64>>> {
        let (w, n) = (self.world_size(), mine.len());
        if w == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        let mut buf = vec![0.0; w * n];
        buf[self.rank() * n..(self.rank() + 1) * n].copy_from_slice(mine);
        self.all_reduce_sum(what, &mut buf)?;
        Ok(buf
            .chunks(n.max(1))
            .take(w)
            .map(|c| c[..n].to_vec())
            .collect())
    }

    /// Every rank's bytes, in rank order: the lengths, then one broadcast per rank.
    pub fn all_gather_bytes(&self, what: &str, mine: Vec<u8>) -> Result<Vec<Vec<u8>>> {
        let w = self.world_size();
        if w == 1 {
            return Ok(vec![mine]);
        }
        let lens = self.all_gather_f64(what, &[mine.len() as f64])?;
        let mut out = Vec::with_capacity(w);
        for (r, len) in lens.iter().enumerate() {
            let mut buf = if r == self.rank() {
                mine.clone()
            } else {
                vec![0u8; len[0] as usize]
            };
            self.watched(what, |c| c.broadcast(r, &mut buf))?;
            out.push(buf);
        }
        Ok(out)
    }

    /// Every rank's `mine`, in rank order, through JSON (floats cross exactly: serde_json
    /// is built with `float_roundtrip`).
    pub fn all_gather_json<T>(&self, what: &str, mine: &T) -> Result<Vec<T>>
    where
        T: serde::Serialize + serde::de::DeserializeOwned + Clone,
    {
        if !self.is_distributed() {
            return Ok(vec![mine.clone()]);
        }
        let bytes = serde_json::to_vec(mine).context("encoding for a gather")?;
        self.all_gather_bytes(what, bytes)?
            .iter()
            .enumerate()
            .map(|(r, b)| {
                serde_json::from_slice(b).with_context(|| format!("decoding rank {r}'s {what}"))
            })
            .collect()
    }

    /// Wait until every rank got here.
    pub fn barrier(&self, what: &str) -> Result<()> {
        if !self.is_distributed() {
            return Ok(());
        }
        self.watched(what, |c| c.barrier())
    }

    /// Run `f`; when it fails in a job of several processes, print the error with this
    /// rank and end the job (a rank that just returned would leave the others waiting
    /// in their next collective until the watchdog fired).
    pub fn or_abort<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let out = f();
        if let Err(e) = &out {
            if self.is_distributed() {
                crate::note!(
                    "error: rank {} of {}: {e:#}",
                    self.rank(),
                    self.world_size()
                );
                self.inner.abort(1);
            }
        }
        out
    }
}

/// One line of [`Dist::comm_report`].
#[derive(Debug, Clone, PartialEq)]
pub struct CommTime {
    pub what: String,
    pub calls: usize,
    /// Over its calls, the sum of the shortest rank's seconds (about the transfer).
    pub least_secs: f64,
    /// Over its calls, the sum of the longest rank's seconds (transfer + waiting).
    pub most_secs: f64,
}

/// `block(n, w, r)`: see [`Dist::block`].
pub fn block(n: usize, w: usize, r: usize) -> Range<usize> {
    let (base, extra) = (n / w, n % w);
    let start = r * base + r.min(extra);
    start..start + base + usize::from(r < extra)
}

fn timeout_from_env() -> Result<Duration> {
    match std::env::var(TIMEOUT_VAR) {
        Err(_) => Ok(DEFAULT_TIMEOUT),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if s > 0.0 && s.is_finite() => Ok(Duration::from_secs_f64(s)),
            _ => bail!("{TIMEOUT_VAR}={v}: expected a positive number of seconds"),
        },
    }
}

/// Ends the process when a collective waits longer than the timeout: a peer died
/// without its launcher stopping the job, or hangs.
struct Watchdog {
    /// The collective in progress and when it started.
    current: Arc<Mutex<Option<(String, Instant)>>>,
}

impl Watchdog {
    fn start(rank: usize, timeout: Duration) -> Self {
        let current: Arc<Mutex<Option<(String, Instant)>>> = Arc::new(Mutex::new(None));
        let watched = current.clone();
        let tick = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(5));
        std::thread::spawn(move || loop {
            std::thread::sleep(tick);
            let late = match watched.lock() {
                Ok(g) => g
                    .as_ref()
                    .filter(|(_, t)| t.elapsed() > timeout)
                    .map(|(w, t)| (w.clone(), t.elapsed())),
                Err(_) => None,
            };
            if let Some((what, waited)) = late {
                crate::note!(
                    "error: rank {rank}: collective `{what}` waited {:.0} s for the other \
                     ranks (limit {TIMEOUT_VAR}={:.0}): a peer process died or hangs; \
                     ending this process",
                    waited.as_secs_f64(),
                    timeout.as_secs_f64()
                );
                std::process::exit(1);
            }
        });
        Self { current }
    }

    fn arm(&self, what: &str) {
        if let Ok(mut g) = self.current.lock() {
            *g = Some((what.to_string(), Instant::now()));
        }
    }

    fn disarm(&self) {
        if let Ok(mut g) = self.current.lock() {
            *g = None;
        }
    }
}

/// Join the process group. `device` is the `[model] device`; NCCL puts rank r on
/// `cuda:LOCAL_RANK`.
fn connect(l: &Launch, device: &mut String, timeout: Duration) -> Result<Box<dyn Collective>> {
    match l.engine {
        launch::Engine::Mpi => connect_mpi(l),
        launch::Engine::Nccl => connect_nccl(l, device, timeout),
    }
}

#[cfg(feature = "mpi")]
fn connect_mpi(l: &Launch) -> Result<Box<dyn Collective>> {
    Ok(Box::new(mpi::Mpi::init(l)?))
}

#[cfg(not(feature = "mpi"))]
fn connect_mpi(l: &Launch) -> Result<Box<dyn Collective>> {
    bail!(
        "started by {} as rank {} of {}, but this concord was built without MPI: \
         rebuild with `cargo build --release --features mpi` (needs an MPI library, \
         e.g. `apt-get install libopenmpi-dev openmpi-bin`, and libclang)",
        l.via,
        l.rank,
        l.world_size
    )
}

#[cfg(feature = "nccl")]
fn connect_nccl(l: &Launch, device: &mut String, timeout: Duration) -> Result<Box<dyn Collective>> {
    *device = launch::nccl_device(device, l)?;
    Ok(Box::new(nccl::Nccl::init(l, device, timeout)?))
}

#[cfg(not(feature = "nccl"))]
fn connect_nccl(l: &Launch, _: &mut String, _: Duration) -> Result<Box<dyn Collective>> {
    bail!(
        "started by {} as rank {} of {}: that launch trains over NCCL, and this concord \
         was built without it (`cargo build --release --features cuda,nccl`); on CPUs \
         launch with `mpirun -np N` and a `--features mpi` build",
        l.via,
        l.rank,
        l.world_size
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_tile_the_items_in_order_and_differ_by_at_most_one() {
        for n in 0..20 {
            for w in 1..6 {
                let blocks: Vec<Range<usize>> = (0..w).map(|r| block(n, w, r)).collect();
                assert_eq!(blocks[0].start, 0);
                assert_eq!(blocks[w - 1].end, n);
                for p in blocks.windows(2) {
                    assert_eq!(p[0].end, p[1].start);
                    assert!(p[0].len() >= p[1].len() && p[0].len() <= p[1].len() + 1);
                }
            }
        }
        assert_eq!(block(5, 2, 0), 0..3);
        assert_eq!(block(5, 2, 1), 3..5);
        assert_eq!(block(1, 2, 1), 1..1);
    }

    #[test]
    fn one_process_collectives_are_the_identity() {
        let d = Dist::single();
        let mut v = [1.5, -2.0];
        d.all_reduce_sum("x", &mut v).unwrap();
        assert_eq!(v, [1.5, -2.0]);
        assert_eq!(d.all_gather_f64("x", &[3.0]).unwrap(), vec![vec![3.0]]);
        assert_eq!(
            d.all_gather_json("x", &vec![1u32, 2]).unwrap(),
            vec![vec![1u32, 2]]
        );
        assert!(d.any("x", true).unwrap());
        assert!(!d.any("x", false).unwrap());
        assert_eq!(d.block(7), 0..7);
    }

    #[test]
    fn float_values_cross_a_json_gather_exactly() {
        // The gather of scored rollouts relies on it (serde_json's float_roundtrip).
        let xs: Vec<f64> = (1..2000)
            .map(|i| (i as f64).sqrt() * 1e-3 + (i as f64).ln() * 1.0e5)
            .collect();
        let back: Vec<f64> = serde_json::from_slice(&serde_json::to_vec(&xs).unwrap()).unwrap();
        assert!(xs
            .iter()
            .zip(&back)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
        let fs: Vec<f32> = xs.iter().map(|&x| (x * 1e-7) as f32).collect();
        let back: Vec<f32> = serde_json::from_slice(&serde_json::to_vec(&fs).unwrap()).unwrap();
        assert!(fs
            .iter()
            .zip(&back)
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}
