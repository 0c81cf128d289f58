//! Running on the Host transport (no GPU): host vectors and the collectives' host calls,
//! timed with the wall clock.

use mscclpp::host::collectives::Exec;
use std::time::Instant;

use crate::host::collectives::{Collectives, P2pOp};

use super::PerfError;
use super::args::{Collective, Config};
use super::check::{Elem, Strictness};
use super::report::Shape;
use super::sweep::{Placement, Timed, check_inputs, host_vec, out_range, reference};

/// Elements a [`HostRunner`] holds at most for a sweep whose largest shape is `largest`:
/// its send and receive buffers and the in-place send copy (`slot`), and while
/// [`HostRunner::load_inputs`] runs, the check's fresh input and receive image beside them.
/// Keep in step with the runner: the host-memory check before the ranks allocate counts it.
pub(super) fn host_runner_peak(largest: &Shape) -> u128 {
    3 * u128::from(largest.send_count) + 2 * u128::from(largest.count)
}

pub(super) struct HostRunner<T: Elem> {
    send: Vec<T>,
    recv: Vec<T>,
    /// In-place all-gather: the rank's own slot, sent from here.
    slot: Vec<T>,
}

impl<T: Elem> HostRunner<T> {
    pub(super) fn new(coll: &Collectives, largest: &Shape) -> Result<Self, PerfError> {
        let _ = coll;
        Ok(HostRunner {
            send: host_vec(largest.send_count, T::default(), "the send buffer")?,
            recv: host_vec(largest.count, T::default(), "the receive buffer")?,
            slot: Vec::new(),
        })
    }

    fn run_once(
        &mut self,
        config: &Config,
        coll: &Collectives,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let (sc, n) = (shape.send_count as usize, shape.count as usize);
        let op = config.args.redop.reduce_op(config.args.dtype, coll.rank());
        let root = config.args.root;
        match (config.args.collective, placement) {
            (Collective::AllReduce, Placement::OutOfPlace) => {
                coll.all_reduce(&self.send[..sc], &mut self.recv[..n], op, Exec::Host)?
            }
            (Collective::AllReduce, Placement::InPlace) => {
                coll.all_reduce_in_place(&mut self.recv[..n], op, Exec::Host)?
            }
            (Collective::AllGather, Placement::OutOfPlace) => {
                coll.all_gather(&self.send[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::AllGather, Placement::InPlace) => {
                coll.all_gather(&self.slot[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::ReduceScatter, Placement::OutOfPlace) => {
                let per = n / coll.nranks();
                coll.reduce_scatter(&self.send[..sc], &mut self.recv[..per], op, Exec::Host)?
            }
            (Collective::ReduceScatter, Placement::InPlace) => {
                coll.reduce_scatter_in_place(&mut self.recv[..n], op, Exec::Host)?
            }
            (Collective::Broadcast, Placement::OutOfPlace) => {
                coll.broadcast(&self.send[..sc], &mut self.recv[..n], root, Exec::Host)?
            }
            (Collective::Broadcast, Placement::InPlace) => {
                coll.broadcast_in_place(&mut self.recv[..n], root, Exec::Host)?
            }
            (Collective::Reduce, Placement::OutOfPlace) => {
                coll.reduce(&self.send[..sc], &mut self.recv[..n], op, root, Exec::Host)?
            }
            (Collective::Reduce, Placement::InPlace) => {
                coll.reduce_in_place(&mut self.recv[..n], op, root, Exec::Host)?
            }
            (Collective::AllToAll, Placement::OutOfPlace) => {
                coll.all_to_all(&self.send[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::AllToAll, Placement::InPlace) => {
                coll.all_to_all(&self.slot[..sc], &mut self.recv[..n], Exec::Host)?
            }
            (Collective::SendRecv, _) => {
                let (r, nr) = (coll.rank(), coll.nranks());
                let ops = [
                    P2pOp::Send {
                        buf: self.send.as_ptr() as u64,
                        count: n,
                        dtype: config.args.dtype,
                        peer: (r + 1) % nr,
                    },
                    P2pOp::Recv {
                        buf: self.recv.as_mut_ptr() as u64,
                        count: n,
                        dtype: config.args.dtype,
                        peer: (r + nr - 1) % nr,
                    },
                ];
                // SAFETY: both vectors hold at least `n` elements (the largest shape) and
                // are borrowed for the call.
                unsafe { coll.group(&ops, Exec::Host)? }
            }
        }
        Ok(())
    }

    fn load_inputs(
        &mut self,
        config: &Config,
        coll: &Collectives,
        placement: Placement,
        shape: &Shape,
    ) -> Result<(), PerfError> {
        let bs = coll.communicator().bootstrap();
        // Peers may still be in the previous operation.
        bs.barrier()?;
        let (input, recv) =
            check_inputs::<T>(config, coll.nranks(), coll.rank(), placement, shape)?;
        self.recv[..recv.len()].copy_from_slice(&recv);
        self.send[..input.len()].copy_from_slice(&input);
        self.slot = input;
        Ok(bs.barrier()?)
    }

    pub(super) fn measure(
        &mut self,
        config: &Config,
        coll: &Collectives,
        placement: Placement,
        shape: &Shape,
    ) -> Result<Timed, PerfError> {
        let a = &config.args;
        let bs = coll.communicator().bootstrap();
        // Inputs always: the in-place all-gather sends from `slot`.
        self.load_inputs(config, coll, placement, shape)?;
        for _ in 0..a.warmup_iters {
            self.run_once(config, coll, placement, shape)?;
        }
        bs.barrier()?;
        let t = Instant::now();
        for _ in 0..a.iters {
            self.run_once(config, coll, placement, shape)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / a.iters as f64;
        let wrong = if config.check() {
            self.load_inputs(config, coll, placement, shape)?;
            self.run_once(config, coll, placement, shape)?;
            let (c, n, rank) = (a.collective, coll.nranks(), coll.rank());
            Some(reference(config, n).count_wrong(
                Strictness::Exact,
                rank,
                shape.send_count,
                &self.recv[out_range(c, placement, shape, rank, n)],
            ))
        } else {
            None
        };
        Ok(Timed {
            us,
            host_us: None,
            wrong,
        })
    }
}
