//! The communicator's proxy thread: starting, stopping, its errors.

use std::sync::{MutexGuard, PoisonError};

use super::{CommError, Communicator, setup};
use crate::proxy::ProxyService;

impl Communicator {
    /// Starts the proxy thread serving this communicator's FIFO. Takes `&self` so that
    /// handles from [`device_connections`](Self::device_connections), which borrow the
    /// communicator, may be taken before it.
    pub fn proxy_launch(&self) -> Result<(), CommError> {
        let mut proxy = self.proxy_lock();
        if proxy.is_some() {
            return Err(CommError::State(
                "proxy_launch: the proxy is already running".into(),
            ));
        }
        let task = setup::proxy_task(self)?;
        let name = format!("mscclpp-proxy-{}", self.rank());
        *proxy = Some(
            ProxyService::launch(task, name)
                .map_err(|e| CommError::State(format!("cannot start the proxy thread: {e}")))?,
        );
        Ok(())
    }

    /// Stops the proxy after it has served every trigger already pushed (joining its
    /// thread); returns the errors it reported (malformed triggers, failed copies), if any.
    pub fn proxy_stop(&self) -> Result<(), CommError> {
        let taken = self.proxy_lock().take();
        let Some(p) = taken else {
            return Err(CommError::State(
                "proxy_stop: the proxy is not running".into(),
            ));
        };
        let errors = p.stop();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(CommError::Proxy(errors))
        }
    }

    /// The running proxy's first error, as text, if it has reported one (a put outside the
    /// buffers names the connection, the peer rank, the offsets, the size and both buffer
    /// sizes). Available as soon as the proxy has refused the trigger, without stopping it;
    /// [`proxy_stop`](Self::proxy_stop) returns every error as [`CommError::Proxy`].
    pub fn proxy_error(&self) -> Option<String> {
        self.proxy_lock().as_ref().and_then(|p| p.first_error())
    }

    /// Errors the running proxy has reported so far (as text) and how many were dropped.
    /// An error is recorded before the trigger that caused it is popped, so it is here by
    /// the time the kernel's `signal`/`flush` after that trigger returns (or fails: see
    /// `DevConn::try_signal`), without stopping the proxy.
    pub fn proxy_errors(&self) -> (Vec<String>, u64) {
        self.proxy_lock()
            .as_ref()
            .map(|p| p.errors())
            .unwrap_or_default()
    }

    /// The proxy slot (a panic while it was held leaves nothing half-done in it).
    fn proxy_lock(&self) -> MutexGuard<'_, Option<ProxyService>> {
        self.proxy.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The proxy slot, without locking.
    pub(super) fn proxy_mut(&mut self) -> &mut Option<ProxyService> {
        self.proxy.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}
