//! Which process group this process was started into, read from its launcher's
//! environment variables:
//!
//! | launcher | variables | engine |
//! | --- | --- | --- |
//! | `mpirun` (Open MPI) | `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK` | MPI |
//! | `mpiexec` (MPICH, Intel MPI) | `PMI_RANK`, `PMI_SIZE` | MPI |
//! | `torchrun`, or set by hand | `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT` | NCCL |
//! | `srun` | `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID` | NCCL on a CUDA device, else MPI |
//!
//! None of them: one process. NCCL ranks meet at `MASTER_ADDR`: rank 0 hands out the
//! NCCL unique id on port `MASTER_PORT + 1` (`MASTER_PORT` itself is torchrun's store)
//! or `CONCORD_NCCL_PORT` ([`serve_id`], [`fetch_id`]); NCCL itself then carries every
//! collective.
use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The engine a launch asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Mpi,
    Nccl,
}

/// A launch read from the environment.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    pub engine: Engine,
    pub rank: usize,
    pub world_size: usize,
    /// The rank among this node's processes (its GPU).
    pub local_rank: usize,
    /// Which launcher's variables these were.
    pub via: &'static str,
}

impl Launch {
    /// From this process's environment.
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|k| std::env::var(k).ok())
    }

    /// From a variable lookup (testable without touching the process environment).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let num = |k: &str| -> Result<Option<usize>> {
            match var(k) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .with_context(|| format!("{k}={v}: expected a non-negative integer")),
            }
        };
        let launch = |engine, rank, world_size, local_rank: Option<usize>, via| {
            Ok(Launch {
                engine,
                rank,
                world_size,
                local_rank: local_rank.unwrap_or(0),
                via,
            })
        };
        let checked = |l: Result<Launch>| -> Result<Launch> {
            let l = l?;
            if l.world_size == 0 || l.rank >= l.world_size {
                bail!(
                    "{}: rank {} is not below the world size {}",
                    l.via,
                    l.rank,
                    l.world_size
                );
            }
            Ok(l)
        };
        if let (Some(r), Some(w)) = (num("OMPI_COMM_WORLD_RANK")?, num("OMPI_COMM_WORLD_SIZE")?) {
            let local = num("OMPI_COMM_WORLD_LOCAL_RANK")?;
            return checked(launch(Engine::Mpi, r, w, local, "mpirun (Open MPI)"));
        }
        if let (Some(r), Some(w)) = (num("PMI_RANK")?, num("PMI_SIZE")?) {
            let local = num("MPI_LOCALRANKID")?;
            return checked(launch(Engine::Mpi, r, w, local, "mpiexec (PMI)"));
        }
        if let (Some(r), Some(w)) = (num("RANK")?, num("WORLD_SIZE")?) {
            let local = num("LOCAL_RANK")?;
            return checked(launch(
                Engine::Nccl,
                r,
                w,
                local,
                "torchrun-style variables",
            ));
        }
        // SLURM_STEP_NUM_TASKS is set for the tasks srun starts, not in the batch script
        // around them (where SLURM_NTASKS would make a lone process wait for peers).
        if let (Some(r), Some(w)) = (num("SLURM_PROCID")?, num("SLURM_STEP_NUM_TASKS")?) {
            let local = num("SLURM_LOCALID")?;
            // srun with an MPI plugin (PMIx) starts MPI programs; without NCCL that is
            // the only engine left.
            let engine = if cfg!(feature = "nccl") && var("PMIX_RANK").is_none() {
                Engine::Nccl
            } else {
                Engine::Mpi
            };
            return checked(launch(engine, r, w, local, "srun (Slurm)"));
        }
        Ok(Launch {
            engine: Engine::Mpi,
            rank: 0,
            world_size: 1,
            local_rank: 0,
            via: "no launcher",
        })
    }
}

/// The device of an NCCL rank: `cuda` / `auto` / `cuda:0` become `cuda:LOCAL_RANK`.
pub fn nccl_device(device: &str, l: &Launch) -> Result<String> {
    use crate::config::{parse_device_name, DeviceName};
    match parse_device_name(device)? {
        DeviceName::Cpu => bail!(
            "{}: NCCL trains on GPUs, and [model] device = \"{device}\"; launch CPU runs \
             with `mpirun -np N` (a `--features mpi` build)",
            l.via
        ),
        DeviceName::Auto | DeviceName::Cuda(0) => Ok(format!("cuda:{}", l.local_rank)),
        DeviceName::Cuda(n) => bail!(
            "[model] device = \"cuda:{n}\" in an NCCL launch: each rank takes \
             cuda:LOCAL_RANK; write device = \"cuda\" (and pick GPUs with \
             CUDA_VISIBLE_DEVICES)"
        ),
    }
}

/// Where NCCL ranks meet: `MASTER_ADDR` and `CONCORD_NCCL_PORT`, else `MASTER_PORT + 1`.
pub fn rendezvous_addr(var: impl Fn(&str) -> Option<String>) -> Result<String> {
    let host = var("MASTER_ADDR").context(
        "MASTER_ADDR is not set: an NCCL launch needs the address of rank 0's node \
         (torchrun sets it; under Slurm export it, e.g. the first host of \
         `scontrol show hostnames $SLURM_JOB_NODELIST`)",
    )?;
    let port = match var("CONCORD_NCCL_PORT") {
        Some(p) => p
            .trim()
            .parse::<u16>()
            .with_context(|| format!("CONCORD_NCCL_PORT={p}: expected a port"))?,
        None => {
            let p = var("MASTER_PORT").context("MASTER_PORT is not set")?;
            let p: u16 = p
                .trim()
                .parse()
                .with_context(|| format!("MASTER_PORT={p}: expected a port"))?;
            p.checked_add(1).context("MASTER_PORT + 1 is not a port")?
        }
    };
    Ok(format!("{host}:{port}"))
}

/// The bytes every rank checks to be sure it reached a Concord rendezvous.
const MAGIC: &[u8; 8] = b"CONCORD1";

/// Rank 0: hand `id` to the `world_size - 1` other ranks connecting to `addr`, or fail
/// after `timeout`.
pub fn serve_id(addr: &str, id: &[u8], world_size: usize, timeout: Duration) -> Result<()> {
    let port = addr.rsplit(':').next().unwrap_or("0");
    let listener = TcpListener::bind(format!("0.0.0.0:{port}"))
        .with_context(|| format!("rank 0: listening on port {port} for the other ranks"))?;
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + timeout;
    let mut served = vec![false; world_size];
    served[0] = true;
    while served.iter().any(|s| !s) {
        match listener.accept() {
            Ok((mut s, _)) => {
                s.set_nonblocking(false)?;
                s.set_read_timeout(Some(Duration::from_secs(30)))?;
                let mut hello = [0u8; 16];
                if s.read_exact(&mut hello).is_err() || &hello[..8] != MAGIC {
                    continue; // not one of ours (a port scan, a stale process)
                }
                let rank = u64::from_le_bytes(hello[8..16].try_into()?) as usize;
                if rank == 0 || rank >= world_size {
                    bail!("rendezvous: a process announced rank {rank} of {world_size}");
                }
                let mut msg = MAGIC.to_vec();
                msg.extend_from_slice(&(id.len() as u64).to_le_bytes());
                msg.extend_from_slice(id);
                s.write_all(&msg)?;
                served[rank] = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() > deadline {
                    let missing: Vec<usize> = (0..world_size).filter(|&r| !served[r]).collect();
                    bail!(
                        "rendezvous on {addr}: ranks {missing:?} did not connect within {:.0} s",
                        timeout.as_secs_f64()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e).context("rendezvous: accepting a connection"),
        }
    }
    Ok(())
}

/// Rank `rank` > 0: the id rank 0 serves on `addr` (retried until `timeout`: rank 0 may
/// start later).
pub fn fetch_id(addr: &str, rank: usize, timeout: Duration) -> Result<Vec<u8>> {
    let deadline = Instant::now() + timeout;
    loop {
        let attempt = (|| -> Result<Vec<u8>> {
            let sock = addr
                .to_socket_addrs()
                .with_context(|| format!("resolving {addr}"))?
                .next()
                .with_context(|| format!("{addr} has no address"))?;
            let mut s = TcpStream::connect_timeout(&sock, Duration::from_secs(5))?;
            s.set_read_timeout(Some(Duration::from_secs(30)))?;
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&(rank as u64).to_le_bytes());
            s.write_all(&hello)?;
            let mut head = [0u8; 16];
            s.read_exact(&mut head)?;
            if &head[..8] != MAGIC {
                bail!("{addr} is not a Concord rendezvous");
            }
            let n = u64::from_le_bytes(head[8..16].try_into()?) as usize;
            if n > 1 << 20 {
                bail!("rendezvous: an id of {n} bytes");
            }
            let mut id = vec![0u8; n];
            s.read_exact(&mut id)?;
            Ok(id)
        })();
        match attempt {
            Ok(id) => return Ok(id),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!(
                    "rank {rank}: no rendezvous with rank 0 on {addr} within {:.0} s",
                    timeout.as_secs_f64()
                )))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn no_launcher_is_one_process() {
        let l = Launch::from_vars(vars(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")])).unwrap();
        assert_eq!(l.world_size, 1, "a batch script around srun is not a rank");
    }

    #[test]
    fn launchers_are_read_from_their_variables() {
        let l = Launch::from_vars(vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("RANK", "5"),
        ]))
        .unwrap();
        assert_eq!(
            (l.engine, l.rank, l.world_size, l.local_rank),
            (Engine::Mpi, 1, 2, 1)
        );
        let l = Launch::from_vars(vars(&[("PMI_RANK", "2"), ("PMI_SIZE", "3")])).unwrap();
        assert_eq!((l.engine, l.rank, l.world_size), (Engine::Mpi, 2, 3));
        let l = Launch::from_vars(vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "3"),
        ]))
        .unwrap();
        assert_eq!(
            (l.engine, l.rank, l.world_size, l.local_rank),
            (Engine::Nccl, 3, 8, 3)
        );
        let l = Launch::from_vars(vars(&[
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_NUM_TASKS", "2"),
            ("SLURM_LOCALID", "1"),
            ("PMIX_RANK", "1"),
        ]))
        .unwrap();
        assert_eq!((l.engine, l.rank, l.world_size), (Engine::Mpi, 1, 2));
    }

    #[test]
    fn bad_launcher_values_are_named() {
        let e = Launch::from_vars(vars(&[("RANK", "x"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(format!("{e:#}").contains("RANK=x"), "{e:#}");
        let e = Launch::from_vars(vars(&[("RANK", "2"), ("WORLD_SIZE", "2")])).unwrap_err();
        assert!(
            format!("{e:#}").contains("not below the world size"),
            "{e:#}"
        );
    }

    #[test]
    fn nccl_ranks_take_their_local_gpu() {
        let l = Launch::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
        ]))
        .unwrap();
        assert_eq!(nccl_device("cuda", &l).unwrap(), "cuda:1");
        assert_eq!(nccl_device("auto", &l).unwrap(), "cuda:1");
        assert!(nccl_device("cpu", &l).is_err());
        assert!(nccl_device("cuda:3", &l).is_err());
    }

    #[test]
    fn rendezvous_port_defaults_past_torchruns_store() {
        let a = rendezvous_addr(vars(&[("MASTER_ADDR", "node1"), ("MASTER_PORT", "29500")]));
        assert_eq!(a.unwrap(), "node1:29501");
        let a = rendezvous_addr(vars(&[
            ("MASTER_ADDR", "node1"),
            ("MASTER_PORT", "29500"),
            ("CONCORD_NCCL_PORT", "40000"),
        ]));
        assert_eq!(a.unwrap(), "node1:40000");
        let e = rendezvous_addr(vars(&[("MASTER_PORT", "1")])).unwrap_err();
        assert!(format!("{e:#}").contains("MASTER_ADDR"));
    }

    #[test]
    fn rank_zero_hands_its_id_to_every_other_rank() {
        // A free port: bind to 0, read it, release it.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let id: Vec<u8> = (0..128u8).collect();
        let t = Duration::from_secs(20);
        let clients: Vec<_> = (1..3)
            .map(|r| {
                let a = addr.clone();
                std::thread::spawn(move || fetch_id(&a, r, t).unwrap())
            })
            .collect();
        serve_id(&addr, &id, 3, t).unwrap();
        for c in clients {
            assert_eq!(c.join().unwrap(), id);
        }
    }

    #[test]
    fn a_missing_rank_fails_the_rendezvous_in_bounded_time() {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let t0 = Instant::now();
        let e = serve_id(
            &format!("127.0.0.1:{port}"),
            &[1, 2],
            2,
            Duration::from_millis(300),
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("ranks [1] did not connect"),
            "{e:#}"
        );
        assert!(t0.elapsed() < Duration::from_secs(5));
    }
}
