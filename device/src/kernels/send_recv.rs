//! The send/recv kernel: `p2p(ctx, ops)`, a group of sends and receives over the p2p
//! context (entry point over [`crate::collectives::send_recv`]).

use crate::collectives::CollContext;
use crate::collectives::send_recv::{self, P2pOps};
use crate::kernel;

kernel! {
    /// A group of point-to-point sends and receives over the p2p context `ctx`: see
    /// [`send_recv::run`].
    pub unsafe fn p2p(ctx: *const CollContext, ops: P2pOps) {
        // SAFETY: forwarded to the launcher (the host validates the context and the ops).
        unsafe { send_recv::run(&*ctx, &ops) }
    }
}
crate::launch_bounds!(p2p, 512);
