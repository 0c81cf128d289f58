//! GPU training (in progress).
use mscclpp::host::collectives::Collectives;
use mscclpp::host::cuda::Gpu;

use crate::config::{Args, Config};
use crate::report::RunReport;
use crate::{Error, Ranks};

/// Trains on this rank's GPU.
pub fn run(
    _cfg: &Config,
    _args: &Args,
    _coll: &Collectives,
    _gpu: &Gpu,
    _ranks: &Ranks,
) -> Result<Vec<RunReport>, Error> {
    Err("GPU path not written yet".into())
}
