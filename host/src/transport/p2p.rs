//! The P2P transport's data plane: copy-engine copies on the proxy's stream, and the flag
//! raised one of two ways ([`ProxyFlagMode`]):
//!
//! - `stream` (the default): a stream-ordered 64-bit write (`cuStreamWriteValue64`) after
//!   the copies, into the peer's inbound counter in its GPU memory (CUDA IPC);
//! - `cpu`: the peer's inbound counter lives in host memory (a shared-memory segment the
//!   peer registered with `cuMemHostRegister` and polls through its device mapping); the
//!   proxy learns that the copies before a signal have completed (CUDA events recorded on
//!   its stream, queried without waiting, or the stream synchronized on a flush) and then
//!   stores the epoch itself with a release store. A signal with no copy outstanding is
//!   stored at once, with no copy-engine or driver work at all. The ordering rules live in
//!   the transport's flag queue (tested on the host with an emulated copy engine); the
//!   mode has not been measured on a GPU.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::cuda::{
    CudaEvent, CudaStream, event_reached, memcpy_async, new_event, record_event, write_u64_async,
};

use super::flag_queue::{CopyEngine, FlagQueue};
use super::{DataPlane, Route, TransportError};
use crate::settings::{Settings, SettingsError};

/// The environment variable choosing the [`ProxyFlagMode`] (`stream` or `cpu`); when set it
/// overrides `CommConfig::proxy_flag`.
pub const PROXY_FLAG_ENV: &str = "MSCCLPP_PROXY_FLAG";

/// How a P2P proxy raises the peer's inbound counter after the data (see the
/// [module](self)). Both ends of a connection must use the same mode (setup fails naming
/// [`PROXY_FLAG_ENV`] otherwise). Only proxy channels on a GPU backend are affected.
pub use crate::settings::ProxyFlagMode;

impl ProxyFlagMode {
    /// The mode [`PROXY_FLAG_ENV`] asks for ([`Settings::proxy_flag`]), if it is set; an
    /// unknown value is an error naming it.
    pub fn from_env() -> Result<Option<ProxyFlagMode>, SettingsError> {
        Settings::global().map(|s| s.proxy_flag)
    }
}

impl std::fmt::Display for ProxyFlagMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProxyFlagMode::Stream => "stream",
            ProxyFlagMode::Cpu => "cpu",
        })
    }
}

/// The P2P data plane: `cuMemcpyAsync` on one stream (the proxy's), the flag after the data
/// as its [`ProxyFlagMode`] says.
#[derive(Debug)]
pub struct P2pPlane {
    engine: StreamEngine,
    /// `Some` in the `cpu` mode: the signals waiting for copies.
    cpu: Option<FlagQueue<CudaEvent>>,
}

/// The proxy's stream as a [`CopyEngine`]: marks are events recorded on it (reused).
#[derive(Debug)]
struct StreamEngine {
    stream: Arc<CudaStream>,
    spare: Vec<CudaEvent>,
}

impl CopyEngine for StreamEngine {
    type Mark = CudaEvent;

    fn mark(&mut self) -> Result<CudaEvent, TransportError> {
        let event = match self.spare.pop() {
            Some(e) => e,
            None => new_event(self.stream.context())?,
        };
        record_event(&event, &self.stream)?;
        Ok(event)
    }

    fn reached(&mut self, mark: &CudaEvent) -> Result<bool, TransportError> {
        Ok(event_reached(mark)?)
    }

    fn wait_all(&mut self) -> Result<(), TransportError> {
        self.stream
            .synchronize()
            .map_err(|e| crate::cuda::CudaError::driver("cuStreamSynchronize", e))?;
        Ok(())
    }

    fn recycle(&mut self, mark: CudaEvent) {
        // A few are enough: one per proxy turn is recorded while signals wait.
        if self.spare.len() < 64 {
            self.spare.push(mark);
        }
    }
}

/// The `cpu` mode's flag store.
fn store_flag(addr: u64, epoch: u64) {
    // SAFETY: in the `cpu` mode `remote_flag` is an 8-byte aligned word of the peer's flag
    // segment (shared memory mapped in this process), which the communicator keeps mapped
    // while the proxy runs; both sides access it only atomically (the peer GPU with
    // `ld.acquire.sys` through its registration).
    let flag = unsafe { AtomicU64::from_ptr(addr as *mut u64) };
    // Release: program order after the completion the proxy observed (event or stream
    // synchronize) of the copies this epoch follows; the peer's acquire load of the epoch
    // then reads data the copy engine has finished writing.
    flag.store(epoch, Ordering::Release);
}

impl P2pPlane {
    /// A plane issuing on `stream`, raising flags the `stream` way.
    pub fn new(stream: Arc<CudaStream>) -> P2pPlane {
        P2pPlane::with_mode(stream, ProxyFlagMode::Stream)
    }

    /// A plane issuing on `stream`, raising flags as `mode` says (in the `cpu` mode every
    /// route's `remote_flag` must be a host address in this process).
    pub fn with_mode(stream: Arc<CudaStream>, mode: ProxyFlagMode) -> P2pPlane {
        P2pPlane {
            engine: StreamEngine {
                stream,
                spare: Vec::new(),
            },
            cpu: (mode == ProxyFlagMode::Cpu).then(FlagQueue::default),
        }
    }

    /// The mode this plane raises flags in.
    pub fn mode(&self) -> ProxyFlagMode {
        if self.cpu.is_some() {
            ProxyFlagMode::Cpu
        } else {
            ProxyFlagMode::Stream
        }
    }
}

impl DataPlane for P2pPlane {
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError> {
        route.check(dst_offset, src_offset, size)?;
        if size == 0 {
            return Ok(());
        }
        // SAFETY: the route's addresses are device (or peer-mapped) ranges that the
        // communicator keeps alive while the proxy runs; the range was checked above.
        unsafe {
            memcpy_async(
                route.remote + dst_offset,
                route.local + src_offset,
                size as usize,
                &self.engine.stream,
            )?
        };
        if let Some(q) = &mut self.cpu {
            q.copied();
        }
        Ok(())
    }

    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError> {
        match &mut self.cpu {
            Some(q) => q.signal(route.remote_flag, epoch, &mut store_flag),
            None => {
                // SAFETY: `remote_flag` is an aligned word of the peer's flag buffer, mapped
                // and kept alive by the communicator while the proxy runs.
                unsafe { write_u64_async(route.remote_flag, epoch, &self.engine.stream)? };
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        match &mut self.cpu {
            // Waits only when a copy is outstanding, then stores the waiting flags.
            Some(q) => q.flush(&mut self.engine, &mut store_flag),
            None => self.engine.wait_all(),
        }
    }

    /// In the `cpu` mode: stores the flags whose copies have completed; reports `true`
    /// while a flag still waits, so the proxy keeps polling instead of going idle.
    fn progress(&mut self) -> Result<bool, TransportError> {
        match &mut self.cpu {
            Some(q) => q.progress(&mut self.engine, &mut store_flag),
            None => Ok(false),
        }
    }

    /// In the `cpu` mode a stopping proxy stores every waiting flag (after their copies).
    fn finish(&mut self) -> Result<(), TransportError> {
        match &mut self.cpu {
            Some(q) if q.waiting() > 0 => q.flush(&mut self.engine, &mut store_flag),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_flag_mode_parses_both_names_and_refuses_others() {
        use crate::settings::Choice;
        assert_eq!(ProxyFlagMode::parse("stream"), Ok(ProxyFlagMode::Stream));
        assert_eq!(ProxyFlagMode::parse(" CPU "), Ok(ProxyFlagMode::Cpu));
        let e = Settings::from_vars([(PROXY_FLAG_ENV, "gpu")]).unwrap_err();
        assert_eq!(e.bad[0].value, "gpu");
        let msg = e.to_string();
        assert!(
            msg.contains(PROXY_FLAG_ENV) && msg.contains("stream") && msg.contains("cpu"),
            "{msg}"
        );
        assert!(ProxyFlagMode::parse("").is_err());
        assert_eq!(ProxyFlagMode::default(), ProxyFlagMode::Stream);
        for m in [ProxyFlagMode::Stream, ProxyFlagMode::Cpu] {
            assert_eq!(ProxyFlagMode::parse(&m.to_string()), Ok(m));
        }
    }
}
