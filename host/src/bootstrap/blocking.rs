//! [`BlockingBootstrap`]: the bootstrap for callers outside a tokio runtime.

use tokio::runtime::{Handle, Runtime};

use super::{Bootstrap, BootstrapConfig, BootstrapError, BootstrapRoot};

/// A [`Bootstrap`] with its own tokio runtime (one worker thread, which keeps watching the
/// peers between calls), for callers that are not async. Each method blocks on the async one
/// of the same name; calling one from inside a tokio runtime returns
/// [`BootstrapError::InsideRuntime`] instead of panicking.
///
/// Dropping it closes the bootstrap politely, waiting at most about a second.
#[derive(Debug)]
pub struct BlockingBootstrap {
    // Both are `Some` until `drop` (or `abandon`) takes them out.
    bootstrap: Option<Bootstrap>,
    runtime: Option<Runtime>,
}

fn outside_runtime() -> Result<(), BootstrapError> {
    if Handle::try_current().is_ok() {
        return Err(BootstrapError::InsideRuntime);
    }
    Ok(())
}

impl BlockingBootstrap {
    /// Blocking [`Bootstrap::init`].
    pub fn init(
        nranks: usize,
        rank: usize,
        root: impl Into<BootstrapRoot>,
    ) -> Result<BlockingBootstrap, BootstrapError> {
        Self::init_with_config(nranks, rank, root, BootstrapConfig::default())
    }

    /// Blocking [`Bootstrap::init_with_config`].
    pub fn init_with_config(
        nranks: usize,
        rank: usize,
        root: impl Into<BootstrapRoot>,
        config: BootstrapConfig,
    ) -> Result<BlockingBootstrap, BootstrapError> {
        outside_runtime()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("mscclpp-bootstrap-{rank}"))
            .enable_all()
            .build()
            .map_err(|source| BootstrapError::Io {
                rank,
                context: "cannot start a tokio runtime".into(),
                source,
            })?;
        let root = root.into();
        let bootstrap =
            runtime.block_on(Bootstrap::init_with_config(nranks, rank, root, config))?;
        Ok(BlockingBootstrap {
            bootstrap: Some(bootstrap),
            runtime: Some(runtime),
        })
    }

    /// The async bootstrap inside; use it with [`runtime`](Self::runtime).
    pub fn as_async(&self) -> &Bootstrap {
        // Only `drop` takes it out.
        self.bootstrap
            .as_ref()
            .expect("bootstrap present until drop")
    }

    /// The runtime the bootstrap runs on.
    pub fn runtime(&self) -> &Handle {
        self.rt().handle()
    }

    fn rt(&self) -> &Runtime {
        self.runtime.as_ref().expect("runtime present until drop")
    }

    fn block_on<T>(
        &self,
        fut: impl Future<Output = Result<T, BootstrapError>>,
    ) -> Result<T, BootstrapError> {
        outside_runtime()?;
        self.rt().block_on(fut)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.as_async().rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.as_async().nranks()
    }

    /// Rank among the ranks of this node.
    pub fn local_rank(&self) -> usize {
        self.as_async().local_rank()
    }

    /// Number of ranks on this rank's node.
    pub fn nranks_per_node(&self) -> usize {
        self.as_async().nranks_per_node()
    }

    /// Blocking [`Bootstrap::all_gather`].
    pub fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.block_on(self.as_async().all_gather(data))
    }

    /// Blocking [`Bootstrap::all_gather_within`].
    pub fn all_gather_within(
        &self,
        data: &[u8],
        wait: std::time::Duration,
    ) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.block_on(self.as_async().all_gather_within(data, wait))
    }

    /// Blocking [`Bootstrap::barrier`].
    pub fn barrier(&self) -> Result<(), BootstrapError> {
        self.block_on(self.as_async().barrier())
    }

    /// Blocking [`Bootstrap::barrier_within`].
    pub fn barrier_within(&self, wait: std::time::Duration) -> Result<(), BootstrapError> {
        self.block_on(self.as_async().barrier_within(wait))
    }

    /// Blocking [`Bootstrap::broadcast`].
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>, BootstrapError> {
        self.block_on(self.as_async().broadcast(root, data))
    }

    /// Blocking [`Bootstrap::send`].
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<(), BootstrapError> {
        self.block_on(self.as_async().send(peer, tag, data))
    }

    /// Blocking [`Bootstrap::recv`].
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>, BootstrapError> {
        self.block_on(self.as_async().recv(peer, tag))
    }

    /// Blocking [`Bootstrap::recv_within`].
    pub fn recv_within(
        &self,
        peer: usize,
        tag: u64,
        wait: std::time::Duration,
    ) -> Result<Vec<u8>, BootstrapError> {
        self.block_on(self.as_async().recv_within(peer, tag, wait))
    }

    /// Blocking [`Bootstrap::send_named`].
    pub fn send_named(
        &self,
        peer: usize,
        tag: u64,
        what: &str,
        data: &[u8],
    ) -> Result<(), BootstrapError> {
        self.block_on(self.as_async().send_named(peer, tag, what, data))
    }

    /// Blocking [`Bootstrap::recv_named`].
    pub fn recv_named(&self, peer: usize, tag: u64, what: &str) -> Result<Vec<u8>, BootstrapError> {
        self.block_on(self.as_async().recv_named(peer, tag, what))
    }

    /// Drops every connection without a goodbye (see [`Bootstrap::abandon`]).
    pub fn abandon(mut self) {
        if let Some(bootstrap) = self.bootstrap.take() {
            bootstrap.abandon();
        }
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for BlockingBootstrap {
    fn drop(&mut self) {
        let bootstrap = self.bootstrap.take();
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        if outside_runtime().is_ok() {
            if let Some(bootstrap) = bootstrap {
                runtime.block_on(bootstrap.close());
            }
        } else {
            // Blocking (or dropping a runtime) inside another runtime would panic.
            drop(bootstrap);
            runtime.shutdown_background();
        }
    }
}
