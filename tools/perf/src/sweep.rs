//! The sweep: every size of the command line measured for mscclpp (and NCCL) in both
//! placements, checked, and agreed over the ranks into rows.

use std::io::Write;

use crate::host::bootstrap::BlockingBootstrap;
use crate::host::collectives::{AllGatherAlgo, AllReduceAlgo, Collectives};

use super::PerfError;
use super::args::{AlgoArg, Collective, Config};
use super::check::{self, Elem, Reference};
use super::gpu_runner::GpuRunner;
use super::host_runner::HostRunner;
use super::nccl::Nccl;
use super::report::{self, Measurement, Pair, Row, Shape};

/// Out of place or in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Placement {
    OutOfPlace,
    InPlace,
}

/// Which library runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lib {
    Mscclpp,
    Nccl,
}

/// One timed operation as a rank (or, after [`Runner::measure`], every rank) saw it.
pub(super) struct Timed {
    /// Microseconds per operation on the GPU (or the wall clock on the Host transport).
    pub(super) us: f64,
    /// CPU microseconds to queue one operation (plain launches on a GPU only).
    pub(super) host_us: Option<f64>,
    /// Mismatching elements, when checked.
    pub(super) wrong: Option<u64>,
}

/// Every rank's 8-byte value, in rank order.
fn gather_words(bs: &BlockingBootstrap, bytes: [u8; 8]) -> Result<Vec<[u8; 8]>, PerfError> {
    let all = bs.all_gather(&bytes)?;
    Ok(all
        .iter()
        .filter_map(|b| b.get(..8).and_then(|b| b.try_into().ok()))
        .collect())
}

/// Largest value over ranks.
pub(super) fn max_over_ranks(bs: &BlockingBootstrap, v: f64) -> Result<f64, PerfError> {
    Ok(gather_words(bs, v.to_le_bytes())?
        .into_iter()
        .map(f64::from_le_bytes)
        .fold(f64::NEG_INFINITY, f64::max))
}

/// Sum over ranks.
pub(super) fn sum_over_ranks(bs: &BlockingBootstrap, v: u64) -> Result<u64, PerfError> {
    Ok(gather_words(bs, v.to_le_bytes())?
        .into_iter()
        .map(u64::from_le_bytes)
        .sum())
}

pub(super) fn redop_name(config: &Config) -> &'static str {
    if config.args.collective.reduces() {
        config.args.redop.name()
    } else {
        "none"
    }
}

pub(super) fn algo_name(config: &Config, coll: &Collectives, shape: &Shape) -> String {
    if coll.hosts() > 1 {
        // Hierarchical across hosts: all-reduce, reduce (which follows it) and broadcast
        // choose between one-shot and two-shot across hosts; the others have one form.
        let bytes = shape.bytes as usize;
        let two_shot = match config.args.collective {
            Collective::AllReduce | Collective::Reduce => {
                Some(coll.choose_all_reduce(bytes) == AllReduceAlgo::TwoShot)
            }
            Collective::Broadcast => Some(coll.broadcast_two_shot_across_hosts(bytes)),
            _ => None,
        };
        return match two_shot {
            Some(true) => "cross-host-twoshot",
            Some(false) => "cross-host-oneshot",
            None => "cross-host",
        }
        .into();
    }
    match config.args.collective {
        Collective::AllGather => {
            let per_rank = shape.bytes as usize / coll.nranks().max(1);
            match coll.choose_all_gather(per_rank) {
                AllGatherAlgo::Proxy => "proxy",
                AllGatherAlgo::Packets => "packets",
                _ => "memory",
            }
            .into()
        }
        Collective::AllReduce => {
            let algo = match config.args.algo {
                AlgoArg::Auto => coll.choose_all_reduce(shape.bytes as usize),
                other => other.all_reduce(),
            };
            match algo {
                AllReduceAlgo::Auto => "auto",
                AllReduceAlgo::OneShot => "oneshot",
                AllReduceAlgo::TwoShot => "twoshot",
                AllReduceAlgo::ReadReduce => "readreduce",
                AllReduceAlgo::AllPairs => "allpairs",
                AllReduceAlgo::Proxy => "proxy",
            }
            .into()
        }
        // LL packets or puts, chosen by the library by size.
        _ => "auto".into(),
    }
}

/// Every size of the sweep with its shape (`None`: no element in it).
fn shapes(config: &Config, nranks: usize) -> Vec<(u64, Option<Shape>)> {
    let (c, dtype) = (config.args.collective, config.args.dtype);
    config
        .sizes
        .iter()
        .map(|&s| (s, report::shape(c, s, dtype, nranks)))
        .collect()
}

/// The sweep's size of the most elements, with its shape: what the buffers must hold.
pub(super) fn largest_shape(config: &Config, nranks: usize) -> Result<(u64, Shape), PerfError> {
    let c = config.args.collective;
    shapes(config, nranks)
        .into_iter()
        .filter_map(|(size, s)| Some((size, s?)))
        .max_by_key(|(_, s)| s.count)
        .ok_or_else(|| {
            PerfError::Args(format!(
                "no size of the sweep is large enough for {} of {} on {nranks} ranks: {}",
                c.name(),
                config.args.dtype,
                report::too_small(c)
            ))
        })
}

/// Runs the whole sweep on this rank; rank 0 prints each row as it completes.
pub(super) fn sweep<T: Elem>(
    config: &Config,
    coll: &Collectives,
    nccl: Option<&Nccl>,
) -> Result<Vec<Row>, PerfError> {
    let nranks = coll.nranks();
    let c = config.args.collective;
    let shapes = shapes(config, nranks);
    let (_, largest) = largest_shape(config, nranks)?;
    let mut runner = match coll.gpu() {
        Some(gpu) => Runner::Gpu(GpuRunner::<T>::new(gpu, coll, nccl, &largest)?),
        None => Runner::Host(HostRunner::<T>::new(coll, &largest)?),
    };
    let factor = report::bus_factor(c, nranks);
    let mut rows = Vec::new();
    for (size, shape) in shapes {
        let Some(shape) = shape else {
            if coll.rank() == 0 {
                println!("# skipped {size} B: {}", report::too_small(c));
            }
            continue;
        };
        let mut pair = |lib: Lib| -> Result<Pair, PerfError> {
            let mut m = [None, None];
            for (i, p) in [Placement::OutOfPlace, Placement::InPlace]
                .into_iter()
                .enumerate()
            {
                let t = runner.measure(config, coll, lib, p, &shape)?;
                let mut one = Measurement::new(shape.bytes, t.us, factor, t.wrong);
                one.host_us = t.host_us;
                m[i] = Some(one);
            }
            match m {
                [Some(o), Some(i)] => Ok(Pair {
                    out_of_place: o,
                    in_place: i,
                }),
                _ => unreachable!("both placements are measured"),
            }
        };
        let ours = pair(Lib::Mscclpp)?;
        let theirs = if nccl.is_some() {
            Some(pair(Lib::Nccl)?)
        } else {
            None
        };
        let row = Row {
            bytes: shape.bytes,
            count: shape.count,
            dtype: config.args.dtype.name().into(),
            redop: redop_name(config).into(),
            algo: algo_name(config, coll, &shape),
            mscclpp: ours,
            nccl: theirs,
        };
        if coll.rank() == 0 {
            println!("{}", report::format_row(&row));
            let _ = std::io::stdout().flush();
        }
        rows.push(row);
    }
    Ok(rows)
}

enum Runner<'a, T: Elem> {
    Gpu(GpuRunner<'a, T>),
    Host(HostRunner<T>),
}

impl<T: Elem> Runner<'_, T> {
    /// Times one (library, placement, size) and checks it: (µs, #wrong summed over ranks).
    fn measure(
        &mut self,
        config: &Config,
        coll: &Collectives,
        lib: Lib,
        placement: Placement,
        shape: &Shape,
    ) -> Result<Timed, PerfError> {
        let bs = coll.communicator().bootstrap();
        let t = match self {
            Runner::Gpu(g) => g.measure(config, lib, placement, shape)?,
            Runner::Host(h) => h.measure(config, coll, placement, shape)?,
        };
        // Every rank times the same way (plain or graph), so all or none have a host time.
        let host_us = match t.host_us {
            Some(h) => Some(max_over_ranks(bs, h)?),
            None => None,
        };
        let wrong = match t.wrong {
            Some(w) => Some(sum_over_ranks(bs, w)?),
            None => None,
        };
        Ok(Timed {
            us: max_over_ranks(bs, t.us)?,
            host_us,
            wrong,
        })
    }
}

/// The check's reference of this run.
pub(super) fn reference(config: &Config, nranks: usize) -> Reference {
    Reference {
        collective: config.args.collective,
        dtype: config.args.dtype,
        op: config.args.redop,
        nranks,
        root: config.args.root,
    }
}

/// A host vector of `len` copies of `v` (for `what`), or a clear error when that much memory
/// cannot be had (a size from the command line too large for this machine).
pub(super) fn host_vec<T: Clone>(len: u64, v: T, what: &str) -> Result<Vec<T>, PerfError> {
    let too_large = || {
        PerfError::Args(format!(
            "{what}: {len} elements of {} bytes do not fit in this machine's memory; choose \
             a smaller size (-b/-e)",
            std::mem::size_of::<T>()
        ))
    };
    let n = usize::try_from(len).map_err(|_| too_large())?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| too_large())?;
    out.resize(n, v);
    Ok(out)
}

/// Bytes of a device buffer of `count` elements of `elt` bytes (the `what` buffer), or a
/// clear error when that does not fit in an address.
pub(super) fn buffer_bytes(count: u64, elt: usize, what: &str) -> Result<usize, PerfError> {
    usize::try_from(count)
        .ok()
        .and_then(|c| c.checked_mul(elt))
        .ok_or_else(|| {
            PerfError::Args(format!(
                "the {what} buffer: {count} elements of {elt} bytes is too large; choose a \
                 smaller size (-b/-e)"
            ))
        })
}

/// The inputs of a check run: (send buffer contents, receive buffer contents). Receive
/// elements not written by the input hold [`check::unwritten`], so a collective that writes
/// nothing fails.
pub(super) fn check_inputs<T: Elem>(
    config: &Config,
    nranks: usize,
    rank: usize,
    placement: Placement,
    shape: &Shape,
) -> Result<(Vec<T>, Vec<T>), PerfError> {
    let c = config.args.collective;
    let mut input = host_vec(shape.send_count, T::default(), "the check's input")?;
    reference(config, nranks).fill(rank, &mut input);
    let unwritten = T::from_bits(check::unwritten(config.args.dtype));
    let mut recv = host_vec(shape.count, unwritten, "the check's output")?;
    if effective(c, placement) == Placement::InPlace {
        let at = match c {
            Collective::AllGather => rank * shape.send_count as usize,
            _ => 0,
        };
        recv[at..at + input.len()].copy_from_slice(&input);
    }
    Ok((input, recv))
}

/// The placement actually run: send/recv always runs out of place (an in-place exchange
/// could overwrite data before it is sent), so its in-place columns are a second
/// out-of-place run.
pub(super) fn effective(c: Collective, placement: Placement) -> Placement {
    if c == Collective::SendRecv {
        Placement::OutOfPlace
    } else {
        placement
    }
}

/// The elements of the receive buffer that hold `rank`'s output.
pub(super) fn out_range(
    c: Collective,
    placement: Placement,
    shape: &Shape,
    rank: usize,
    nranks: usize,
) -> std::ops::Range<usize> {
    let len = report::out_count(c, shape, nranks) as usize;
    let at = match (c, placement) {
        (Collective::ReduceScatter, Placement::InPlace) => rank * len,
        _ => 0,
    };
    at..at + len
}
