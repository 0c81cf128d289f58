//! The `mscclpp-perf` tool: nccl-tests for this library (docs/guide/06-design.md §8).
//!
//! Measures all-reduce, all-gather, reduce-scatter, broadcast, reduce, all-to-all or
//! send/recv over a sweep of sizes and prints nccl-tests' columns
//! (size, count, type, redop, then time, algbw, busbw and #wrong out of place and in place),
//! optionally with NCCL run on the same buffers in the same run (`--compare nccl`), a JSON
//! report (`--json`) and an SVG plot (`--plot`).
//!
//! - [`args`]: the command line and its validation;
//! - [`report`]: element counts per size, bus-bandwidth factors, rows and the table;
//! - [`check`]: inputs, expected outputs and `#wrong`;
//! - `host_memory`: what the ranks of a machine need on the Host transport, checked first;
//! - [`json`], [`plot`]: the two output files;
//! - [`nccl`]: finding, loading and running NCCL;
//! - [`main`]: launching (local processes, or under mpirun / torchrun / srun) and running a
//!   rank (`run`), which prints the header (`header`) and runs the sweep (`sweep`) on a GPU
//!   (`gpu_runner`) or on the Host transport (`host_runner`).
//!
//! Timing: on a GPU, CUDA events on the rank's stream around `-n` iterations (with `-G`,
//! around `-G` launches of a CUDA graph holding the `-n` iterations); on the Host transport,
//! the wall clock. The time printed is the largest over the ranks.

pub mod args;
pub mod check;
mod gpu_runner;
mod header;
mod host_memory;
mod host_runner;
pub mod json;
pub mod nccl;
pub mod plot;
pub mod report;
mod run;
mod sweep;

pub use run::main;

/// The library, under the name the modules of this crate use.
pub(crate) use mscclpp::host;

use crate::host::bootstrap::BootstrapError;
use crate::host::communicator::CommError;
use crate::host::cuda::CudaError;
use crate::host::launch::LaunchError;

/// Errors of the perf tool.
#[derive(Debug, thiserror::Error)]
pub enum PerfError {
    /// A bad command line (exit status 2).
    #[error("{0}")]
    Args(String),
    /// Launching the ranks failed.
    #[error(transparent)]
    Launch(#[from] LaunchError),
    /// The control plane failed.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// The communicator or a collective failed.
    #[error(transparent)]
    Comm(#[from] CommError),
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// NCCL could not be found, loaded or run.
    #[error("{0}")]
    Nccl(String),
    /// A file could not be written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        #[source]
        source: std::io::Error,
    },
    /// A JSON report could not be parsed.
    #[error("bad JSON report: {0}")]
    Json(String),
    /// A failure already printed (before the rank's teardown, so that a slow teardown does
    /// not hold its message back); exit status 1.
    #[error("the failure was reported above")]
    Reported,
}

#[cfg(test)]
mod tests;
