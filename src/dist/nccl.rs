//! [`Collective`] over NCCL (cudarc's bindings): one process per GPU, started by
//! `torchrun` or `srun` (see [`super::launch`]). NCCL, not MPI, because the gradients
//! already live on the GPUs: summing them there over NVLink / InfiniBand skips two
//! trips through host memory per step, and clusters that run GPU jobs have NCCL where
//! they may have no MPI at all.
//!
//! Streams: candle runs every CUDA op of a thread on that thread's per-thread default
//! stream, and the communicator is bound to the same stream of the same (primary)
//! context, so a collective is ordered after the kernels that produced its input and
//! before those that read its output without extra events. That holds because the
//! trainer calls collectives from the thread that computes (a [`super::Dist`] cannot
//! leave its thread) and the communicator is blocking (`ncclCommInitRank`): NCCL
//! launches from the calling thread, so the per-thread stream is the caller's.
//! Every collective still waits for its stream before returning, so that a peer that
//! died leaves this rank stuck inside the watched collective, where the watchdog sees
//! it, not in whichever later host read of a tensor happens first.
//!
//! libnccl: candle builds cudarc with `dynamic-linking`, so the binary names
//! `libnccl.so.2` and the dynamic loader finds it (or refuses to start the process)
//! before any of this runs: `pip install nvidia-nccl-cu13` and put its `nvidia/nccl/lib`
//! on `LD_LIBRARY_PATH`, or install the distribution's libnccl2.
use super::launch::{fetch_id, rendezvous_addr, serve_id, Launch};
use super::Collective;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::cuda::cudarc;
use candle_core::op::BackpropOp;
use candle_core::{CudaDevice, CudaStorage, DType, Device, DeviceLocation, Storage, Tensor};
use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};
use cudarc::nccl::result::NcclError;
use cudarc::nccl::{Comm, Id, NcclType, ReduceOp};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes in an NCCL unique id (`ncclUniqueId`).
const ID_BYTES: usize = 128;

pub struct Nccl {
    // Declared before the device: the communicator is aborted while its context lives.
    comm: Comm,
    stream: Arc<CudaStream>,
    /// The CUDA device index of this rank's GPU.
    ordinal: usize,
    _device: CudaDevice,
    /// `2.27.3`, or empty when NCCL would not say.
    version: String,
}

impl Nccl {
    /// Open `device` (`cuda:LOCAL_RANK`), meet the other ranks at `MASTER_ADDR` to share
    /// rank 0's NCCL id, and build the communicator; fails instead of hanging when a
    /// rank does not turn up within `timeout`.
    pub fn init(launch: &Launch, device: &str, timeout: Duration) -> Result<Self> {
        let (rank, world_size) = (launch.rank, launch.world_size);
        let dev = match crate::config::parse_device(device)? {
            Device::Cuda(d) => d,
            _ => bail!("NCCL needs a CUDA device, and this rank got `{device}`"),
        };
        let ordinal = match Device::Cuda(dev.clone()).location() {
            DeviceLocation::Cuda { gpu_id } => gpu_id,
            _ => unreachable!("a CUDA device is at a CUDA location"),
        };
        let stream = dev.cuda_stream();
        let version = match cudarc::nccl::result::get_nccl_version() {
            Ok(v) => version_string(v),
            Err(e) => return Err(nccl_error("ncclGetVersion", &e)),
        };
        let addr = rendezvous_addr(|k| std::env::var(k).ok())?;
        let id = if rank == 0 {
            let id = Id::new().map_err(|e| nccl_error("creating the unique id", &e))?;
            let bytes: Vec<u8> = id.internal().iter().map(|&c| c as u8).collect();
            serve_id(&addr, &bytes, world_size, timeout)?;
            id
        } else {
            let bytes = fetch_id(&addr, rank, timeout)?;
            let internal: [std::ffi::c_char; ID_BYTES] = bytes
                .iter()
                .map(|&b| b as std::ffi::c_char)
                .collect::<Vec<_>>()
                .try_into()
                .map_err(|_| {
                    anyhow!(
                        "rendezvous on {addr}: rank 0 sent an NCCL id of {} bytes, not \
                         {ID_BYTES} (a concord built against another NCCL?)",
                        bytes.len()
                    )
                })?;
            Id::uninit(internal)
        };
        // ncclCommInitRank takes the current device of the calling thread.
        stream
            .context()
            .bind_to_thread()
            .with_context(|| format!("making {device} current"))?;
        // Every rank got the id, but one may still die before joining: then
        // ncclCommInitRank would wait for it forever.
        let joined = Arc::new(AtomicBool::new(false));
        watch_init(joined.clone(), rank, timeout);
        let comm = Comm::from_rank(stream.clone(), rank, world_size, id);
        joined.store(true, Ordering::Relaxed);
        let comm = comm.map_err(|e| {
            nccl_error(
                &format!("joining the communicator as rank {rank} of {world_size} on {device}"),
                &e,
            )
        })?;
        Ok(Self {
            comm,
            stream,
            ordinal,
            _device: dev,
            version,
        })
    }

    /// Sum a host buffer over the ranks through a device copy.
    fn all_reduce_host<T: NcclType + DeviceRepr>(&self, buf: &mut [T]) -> Result<()> {
        self.through_device(buf, |d| {
            self.comm
                .all_reduce_in_place(d, &ReduceOp::Sum)
                .map(drop)
                .map_err(|e| nccl_error("all-reduce", &e))
        })
    }

    /// Run a collective on a device copy of a host buffer and copy the result back.
    fn through_device<T: NcclType + DeviceRepr>(
        &self,
        buf: &mut [T],
        collective: impl FnOnce(&mut CudaSlice<T>) -> Result<()>,
    ) -> Result<()> {
        // Every rank passes the same length: all of them skip, or none.
        if buf.is_empty() {
            return Ok(());
        }
        let mut d = self
            .stream
            .clone_htod(&*buf)
            .context("copying to the GPU")?;
        collective(&mut d)?;
        self.stream
            .memcpy_dtoh(&d, buf)
            .context("copying from the GPU")?;
        self.wait()
    }

    /// Block until the stream (and so every collective queued on it) is done.
    fn wait(&self) -> Result<()> {
        self.stream
            .synchronize()
            .context("waiting for the NCCL stream")
    }
}

impl Collective for Nccl {
    fn rank(&self) -> usize {
        self.comm.rank()
    }

    fn world_size(&self) -> usize {
        self.comm.world_size()
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce_host(buf)
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce_host(buf)
    }

    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        self.through_device(buf, |d| {
            self.comm
                .broadcast_in_place(d, root as i32)
                .map(drop)
                .map_err(|e| nccl_error(&format!("broadcast from rank {root}"), &e))
        })
    }

    fn barrier(&self) -> Result<()> {
        self.all_reduce_host(&mut [0f32])
    }

    /// The gradients stay on the GPU: one contiguous f64 buffer (see
    /// [`super::all_reduce_tensors_on_host`] for why f64) is summed in a single NCCL
    /// call, then cut back into the tensors' shapes and dtypes.
    fn all_reduce_tensors(&self, ts: &mut [Tensor]) -> Result<()> {
        let Some(first) = ts.first() else {
            return Ok(());
        };
        let dev = match first.device() {
            Device::Cuda(d) if ts.iter().all(|t| t.device().same_device(first.device())) => {
                d.clone()
            }
            _ => return super::all_reduce_tensors_on_host(self, ts),
        };
        if let DeviceLocation::Cuda { gpu_id } = first.device().location() {
            if gpu_id != self.ordinal {
                bail!(
                    "gradients on cuda:{gpu_id}, but this rank's NCCL communicator is on \
                     cuda:{}",
                    self.ordinal
                );
            }
        }
        let flat = ts
            .iter()
            .map(|t| t.flatten_all()?.to_dtype(DType::F64))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let flat = Tensor::cat(&flat, 0)?;
        let n = flat.elem_count();
        if n == 0 {
            return Ok(());
        }
        let mut summed = dev.alloc_zeros::<f64>(n)?;
        {
            let (storage, layout) = flat.storage_and_layout();
            let Storage::Cuda(s) = &*storage else {
                bail!("a CUDA tensor without CUDA storage");
            };
            let (start, end) = layout
                .contiguous_offsets()
                .context("the concatenated gradients are not contiguous")?;
            let src = s.as_cuda_slice::<f64>()?.slice(start..end);
            self.comm
                .all_reduce(&src, &mut summed, &ReduceOp::Sum)
                .map_err(|e| nccl_error("gradient all-reduce", &e))?;
        }
        self.wait()?;
        let summed = Tensor::from_storage(
            Storage::Cuda(CudaStorage::wrap_cuda_slice(summed, dev)),
            n,
            BackpropOp::none(),
            false,
        );
        let mut at = 0;
        for t in ts.iter_mut() {
            let k = t.elem_count();
            *t = summed
                .narrow(0, at, k)?
                .reshape(t.shape())?
                .to_dtype(t.dtype())?;
            at += k;
        }
        Ok(())
    }

    /// The launcher (torchrun, srun) stops the other ranks once this one exits; NCCL
    /// gives them no way to learn of it themselves.
    fn abort(&self, code: i32) -> ! {
        std::process::exit(code)
    }

    fn name(&self) -> String {
        if self.version.is_empty() {
            "nccl".into()
        } else {
            format!("nccl {}", self.version)
        }
    }
}

/// `NCCL_VERSION_CODE` as `2.27.3` (major * 10000 + minor * 100 + patch since 2.9,
/// major * 1000 + minor * 100 + patch before).
fn version_string(code: i32) -> String {
    let (major, rest) = if code >= 10000 {
        (code / 10000, code % 10000)
    } else {
        (code / 1000, code % 1000)
    };
    format!("{major}.{}.{}", rest / 100, rest % 100)
}

/// An NCCL failure as an error naming the operation and NCCL's own reason.
fn nccl_error(what: &str, e: &NcclError) -> anyhow::Error {
    // SAFETY: ncclGetErrorString returns a static string for any result code.
    let reason = unsafe {
        let p = cudarc::nccl::sys::ncclGetErrorString(e.0);
        if p.is_null() {
            String::new()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    anyhow!(
        "NCCL {what}: {reason} ({:?}); rerun with NCCL_DEBUG=WARN (or INFO) for NCCL's \
         account of it",
        e.0
    )
}

/// End the process when building the communicator takes longer than `timeout` (a rank
/// died between the rendezvous and `ncclCommInitRank`).
fn watch_init(joined: Arc<AtomicBool>, rank: usize, timeout: Duration) {
    let t0 = Instant::now();
    let tick = (timeout / 10).clamp(Duration::from_millis(50), Duration::from_secs(5));
    std::thread::spawn(move || {
        while !joined.load(Ordering::Relaxed) {
            if t0.elapsed() > timeout {
                crate::note!(
                    "error: rank {rank}: NCCL communicator not built within {:.0} s \
                     ({}): a peer process died or hangs; ending this process",
                    timeout.as_secs_f64(),
                    super::TIMEOUT_VAR
                );
                std::process::exit(1);
            }
            std::thread::sleep(tick);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nccl_version_codes_read_as_releases() {
        assert_eq!(version_string(22703), "2.27.3");
        assert_eq!(version_string(21003), "2.10.3");
        assert_eq!(version_string(2804), "2.8.4");
    }
}
