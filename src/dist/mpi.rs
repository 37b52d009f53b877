//! [`Collective`] over MPI (rsmpi): `mpirun -np N concord train ...`, `srun --mpi=pmix`.
//! The trainer calls MPI from its main thread only (candle's and rayon's worker threads
//! never do), so MPI is initialised `Funneled`.
use super::launch::Launch;
use super::Collective;
use anyhow::{bail, Result};
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;

/// MPI counts are C ints: larger buffers go in pieces.
const PIECE: usize = 1 << 28;

pub struct Mpi {
    // Declared before `universe`: dropped first, then MPI is finalised.
    world: SimpleCommunicator,
    _universe: Universe,
    library: String,
}

impl Mpi {
    /// Initialise MPI and check that its world is the one the launcher announced.
    pub fn init(launch: &Launch) -> Result<Self> {
        let Some((universe, _)) = mpi::initialize_with_threading(mpi::Threading::Funneled) else {
            bail!("MPI was already initialised in this process");
        };
        let world = universe.world();
        let (rank, size) = (world.rank() as usize, world.size() as usize);
        if (rank, size) != (launch.rank, launch.world_size) {
            bail!(
                "{} announced rank {} of {}, but MPI sees rank {rank} of {size}: the MPI \
                 library this concord was built against is not the launcher's",
                launch.via,
                launch.rank,
                launch.world_size
            );
        }
        // A panic unwinding past here would finalise MPI while the other ranks wait in
        // a collective (a hang): end the job instead.
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            // SAFETY: MPI_Abort on the world communicator, which outlives the process.
            unsafe {
                mpi::ffi::MPI_Abort(mpi::ffi::RSMPI_COMM_WORLD, 101);
            }
        }));
        let library = mpi::environment::library_version()
            .map(|v| v.lines().next().unwrap_or("").trim().to_string())
            .unwrap_or_default();
        Ok(Self {
            world,
            _universe: universe,
            library,
        })
    }

    fn all_reduce_sum<T: Equivalence + Copy>(&self, buf: &mut [T]) {
        for piece in buf.chunks_mut(PIECE) {
            let send = piece.to_vec();
            self.world
                .all_reduce_into(&send[..], piece, SystemOperation::sum());
        }
    }
}

impl Collective for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }

    fn world_size(&self) -> usize {
        self.world.size() as usize
    }

    fn all_reduce_sum_f64(&self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce_sum(buf);
        Ok(())
    }

    fn all_reduce_sum_f32(&self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce_sum(buf);
        Ok(())
    }

    fn broadcast(&self, root: usize, buf: &mut [u8]) -> Result<()> {
        let root = self.world.process_at_rank(root as i32);
        for piece in buf.chunks_mut(PIECE) {
            root.broadcast_into(piece);
        }
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.world.barrier();
        Ok(())
    }

    fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    fn name(&self) -> String {
        format!("mpi ({})", self.library)
    }
}
