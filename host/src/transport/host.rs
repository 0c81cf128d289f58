//! The Host transport's data plane: the proxy thread copies with memcpy between buffers in
//! shared memory and publishes the flag with a release store.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{DataPlane, Route, TransportError};

/// memcpy + release-store data plane. Everything completes before the call returns, so
/// [`DataPlane::flush`] has nothing to wait for.
#[derive(Debug, Default)]
pub struct HostPlane;

impl DataPlane for HostPlane {
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError> {
        route.check(dst_offset, src_offset, size)?;
        // SAFETY: the route's addresses are live mappings in this process of the given
        // lengths (set up by the communicator, which keeps them mapped while the proxy
        // runs), and the range was checked above. The two buffers belong to different ranks
        // (or are distinct allocations), so they do not overlap. Concurrent writes to the
        // source are excluded by the DevConn contract (the source is not reused before
        // `signal` returns).
        unsafe {
            std::ptr::copy_nonoverlapping(
                (route.local + src_offset) as *const u8,
                (route.remote + dst_offset) as *mut u8,
                size as usize,
            );
        }
        Ok(())
    }

    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError> {
        // SAFETY: `remote_flag` is an 8-byte aligned word of a live shared mapping that both
        // sides access only atomically.
        let flag = unsafe { AtomicU64::from_ptr(route.remote_flag as *mut u64) };
        // Release: the peer's acquire load of this epoch sees every byte copied above.
        flag.store(epoch, Ordering::Release);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}
