//! Closing a communicator: its proxy stopped, its goodbye told whether its work ended.

use std::sync::Arc;
use std::time::Duration;

use super::{Backend, Communicator};
use crate::cuda::Gpu;

/// Whether every piece of work of `gpu`'s context ended within `wait` (a helper thread
/// synchronises the context; past `wait` it is left to finish on its own).
pub(crate) fn idle_within(gpu: &Gpu, wait: Duration) -> bool {
    let ctx = Arc::clone(gpu.context());
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("mscclpp-close-sync".into())
        .spawn(move || {
            let _ = tx.send(ctx.synchronize().is_ok());
        });
    spawned.is_ok() && rx.recv_timeout(wait).unwrap_or(false)
}

/// How long a dropped [`Communicator`] waits for the work of its GPU context to end before
/// its goodbye says so ([`Bootstrap::set_work_ended_at_close`]); past it, the goodbye says
/// nothing and peers' waits for this rank run to their timeout.
///
/// [`Bootstrap::set_work_ended_at_close`]: crate::bootstrap::Bootstrap::set_work_ended_at_close
const WORK_ENDED_AT_CLOSE_WAIT: Duration = Duration::from_secs(1);

impl Drop for Communicator {
    fn drop(&mut self) {
        // Stop the proxy (joining its thread) before the memory it uses goes (fields drop
        // after this).
        if let Some(p) = self.proxy_mut().take() {
            let _ = p.stop();
        }
        // With the proxy stopped, nothing new is issued; once the context has no work left
        // (kernels' stores, the proxy's copies and flags), everything this rank sent has
        // landed, and the goodbye (sent when the bootstrap drops, below) says so: the
        // peers' user channels then stop waiting for what never comes (`ChannelError::
        // PeerLeft`). On the host backend the proxy's copies are done when it stops, and
        // kernels are threads that ended before the handles' borrow of `self` did.
        let ended = match &self.backend {
            Backend::Gpu(g) => idle_within(g, WORK_ENDED_AT_CLOSE_WAIT),
            Backend::Host => true,
        };
        if ended {
            self.bootstrap.as_async().set_work_ended_at_close();
        }
        // Drop peer mappings before our own memory and before the bootstrap goes.
        self.connections.clear();
        // A peer of this host that died (lost, not departed) may have published names for
        // us that we never received (killed between publishing and sending them): nobody
        // else knows them, so remove its names here.
        let bs = self.bootstrap.as_async();
        let me = self.rank();
        for r in (0..self.nranks()).filter(|&r| r != me && bs.was_lost(r)) {
            if let Some(pid) = bs.pid(r)
                && bs.host_id(r) == bs.host_id(me)
            {
                crate::transport::shm::remove_names_of_dead(pid);
            }
        }
    }
}
