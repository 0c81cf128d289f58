//! What runs a [`Collectives`]' kernels ([`Engine`]) and which ranks it spans ([`Span`]):
//! the backend and the topology as types, chosen once at set-up, so that the GPU's kernels
//! exist exactly when the backend is a GPU and the cross-host state exactly when the ranks
//! are on several hosts.

use super::Collectives;
use super::cross::Cross;
use super::gpu;
use super::scatter_rooted;
use super::send_recv_proxy::RemoteP2p;
use crate::communicator::CommError;

/// What runs the kernels.
pub(super) enum Engine {
    /// GPU backend: the device crate's kernels, loaded into this rank's context.
    Gpu(Box<GpuKernels>),
    /// Host backend: the same kernels compiled for the CPU, run on threads over shared
    /// memory.
    Host,
}

/// The loaded kernels of the GPU backend.
pub(super) struct GpuKernels {
    /// All-reduce, all-gather and what they share (the context in device memory).
    pub(super) core: gpu::Kernels,
    /// Reduce-scatter, reduce, broadcast, all-to-all and send/recv.
    pub(super) scatter_rooted: scatter_rooted::Kernels,
}

/// Which ranks the collectives span.
pub(super) enum Span {
    /// Every rank on this host: memory channels between all of them.
    OneHost,
    /// Ranks on several hosts (or groups of them): the kernels run inside this rank's group,
    /// proxy channels reach the other groups.
    AcrossHosts(Box<AcrossHosts>),
}

/// The state of collectives across hosts.
pub(super) struct AcrossHosts {
    /// The channels to the partners and the staging of the cross-host step.
    pub(super) cross: Cross,
    /// Sends and receives with ranks on other hosts (those agreed at set-up; `None` when
    /// there are none).
    pub(super) remote_p2p: Option<RemoteP2p>,
    /// Why send/recv does not reach every rank on another host, if it does not.
    pub(super) p2p_off: Option<String>,
}

impl Collectives {
    /// The GPU's kernels, or the error of a GPU call on the Host backend.
    pub(super) fn gpu_kernels(&self, call: &str) -> Result<&gpu::Kernels, CommError> {
        match &self.engine {
            Engine::Gpu(k) => Ok(&k.core),
            Engine::Host => Err(CommError::InvalidArgument(format!(
                "{call}: this communicator runs on the host backend (no GPU); pass host \
                 buffers with Exec::Host"
            ))),
        }
    }

    /// The GPU's kernels, for paths only a GPU call reaches (after `gpu_kernels`).
    pub(super) fn on_gpu(&self) -> &GpuKernels {
        match &self.engine {
            Engine::Gpu(k) => k,
            Engine::Host => unreachable!("a GPU path on the Host backend"),
        }
    }

    /// Whether the kernels run on a GPU.
    pub(super) fn runs_on_gpu(&self) -> bool {
        matches!(self.engine, Engine::Gpu(_))
    }

    /// The error of a Host-backend call on a GPU communicator.
    pub(super) fn host_only(&self, call: &str) -> Result<(), CommError> {
        if self.runs_on_gpu() {
            return Err(CommError::InvalidArgument(format!(
                "{call}: this communicator runs on a GPU; pass device buffers with a stream"
            )));
        }
        Ok(())
    }

    /// The cross-host state, or `None` for collectives on one host.
    pub(super) fn cross(&self) -> Option<&Cross> {
        self.across_hosts().map(|a| &a.cross)
    }

    /// The state across hosts, or `None` on one host.
    pub(super) fn across_hosts(&self) -> Option<&AcrossHosts> {
        match &self.span {
            Span::OneHost => None,
            Span::AcrossHosts(a) => Some(a),
        }
    }

    /// Sends and receives with ranks on other hosts, where there are any.
    pub(super) fn remote_p2p(&self) -> Option<&RemoteP2p> {
        self.across_hosts().and_then(|a| a.remote_p2p.as_ref())
    }
}
