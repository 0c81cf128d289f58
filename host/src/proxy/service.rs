//! [`ProxyService`]: the thread that pops triggers from a FIFO and drives a
//! [`DataPlane`].
//!
//! One busy-polling thread per communicator (a dedicated std thread, never an async task).
//! For each trigger, in FIFO order:
//! 1. an unknown connection id is reported ([`ProxyError::UnknownConnection`]) and the
//!    trigger skipped;
//! 2. DATA: the route is bounds-checked and the copy queued; a put leaving either buffer is
//!    reported ([`ProxyError::OutOfBounds`]) and not performed (the signal that may follow it
//!    is still sent, so the peer is not left waiting; its data is simply not there);
//!    on this and every other error that names a connection, the task's `on_refused` hook
//!    runs (the communicator sets the connection's bit in its fault area) and the FIFO's
//!    consumer flags every tail from then on, so the kernel's next `try_signal`/`try_flush`
//!    on that connection fails instead of succeeding;
//! 3. FLAG: the connection's epoch is incremented and written to the peer's inbound counter
//!    after the data (by the plane: stream-ordered, or in the P2P `cpu` mode held back
//!    until the copies before it are known complete and then stored by this thread, in
//!    [`DataPlane::progress`] or at the next flush);
//! 4. SYNC: the plane is flushed, so when the tail moves past this trigger everything
//!    before it has completed;
//! 5. the trigger is popped (the tail is published).
//!
//! Before each poll of the FIFO the plane's [`DataPlane::progress`] runs (IB host staging
//! copies arrived data into GPU memory there and raises the inbound counter); its errors are
//! kept like the others.
//!
//! Errors never stop the loop: triggers keep being popped so that no GPU thread hangs on a
//! full ring, and the errors are kept for the host ([`ProxyService::errors`],
//! [`ProxyService::stop`]).
//!
//! Stopping drains: after the stop request the thread keeps popping until no published
//! trigger is left, lets the plane finish what it holds back ([`DataPlane::finish`]: the
//! P2P `cpu` flag mode's waiting flags), then exits; no queued trigger is lost. Triggers pushed after that are
//! not served (stop the kernels first).
//!
//! Idle policy: spin for 200 µs after the last trigger, then yield for 5 ms, then sleep
//! 20 µs between polls, so an idle proxy does not hold a core (CI machines have two) while
//! one in a conversation answers within a poll.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_device::fifo::TriggerOp;

use super::OwnedFifoConsumer;

use crate::transport::{DataPlane, Route, TransportError};

/// What went wrong in a proxy, reported instead of crashing or corrupting memory.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A trigger named a connection this proxy does not serve.
    #[error(
        "proxy: trigger {seq} names connection {connection}, but only {known} connection(s) exist"
    )]
    UnknownConnection {
        /// Sequence number of the trigger.
        seq: u64,
        /// The id it carried.
        connection: u32,
        /// How many connections the proxy serves.
        known: usize,
    },
    /// A put leaving one of the buffers (not performed).
    #[error("proxy: trigger {seq} on connection {connection} (to rank {peer}): {error}")]
    OutOfBounds {
        /// Sequence number of the trigger.
        seq: u64,
        /// The connection.
        connection: u32,
        /// The rank at the other end of the connection.
        peer: usize,
        /// The bounds error.
        error: TransportError,
    },
    /// The data plane's own work failed (IB host staging: a record or copy of arrived data).
    #[error("proxy: {error}")]
    Progress {
        /// The error.
        error: TransportError,
    },
    /// The data plane failed (e.g. a CUDA call).
    #[error("proxy: trigger {seq} on connection {connection} (to rank {peer}): {error}")]
    Transport {
        /// Sequence number of the trigger.
        seq: u64,
        /// The connection.
        connection: u32,
        /// The rank at the other end of the connection.
        peer: usize,
        /// The error.
        error: TransportError,
    },
}

/// How long an idle proxy keeps spinning before it starts yielding its core, and how long it
/// yields before it sleeps between polls. Time-based, not count-based: a peer's answer in a
/// ping-pong comes tens of microseconds later, and a proxy asleep by then adds a sleep's
/// granularity to every round trip.
const SPIN_FOR: Duration = Duration::from_micros(200);
const YIELD_FOR: Duration = Duration::from_millis(5);

/// Most errors kept; later ones are counted but dropped (a broken kernel can produce
/// millions).
const MAX_KEPT_ERRORS: usize = 64;

#[derive(Debug, Default)]
struct ErrorLog {
    kept: Vec<ProxyError>,
    dropped: u64,
}

/// A running proxy thread.
#[derive(Debug)]
pub struct ProxyService {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    errors: Arc<Mutex<ErrorLog>>,
}

/// Work run first on the proxy thread (binding a CUDA context).
pub(crate) type StartHook = Box<dyn FnOnce() + Send>;

/// Everything the proxy thread needs; moved into it.
pub(crate) struct ProxyTask {
    /// The FIFO's consumer.
    pub consumer: OwnedFifoConsumer,
    /// Route of each connection id.
    pub routes: Vec<Route>,
    /// Signals sent so far on each connection; kept by the communicator so that a relaunched
    /// proxy continues the epochs (only the running proxy thread changes them).
    pub epochs: Arc<[AtomicU64]>,
    /// The data plane.
    pub plane: Box<dyn DataPlane>,
    /// Runs first on the proxy thread (binding a CUDA context).
    pub on_start: Option<StartHook>,
    /// The rank at the other end of each connection id (for error messages).
    pub peers: Vec<usize>,
    /// Runs on the proxy thread when a trigger of a connection is refused or fails, before
    /// the trigger is popped (the communicator marks the connection in its fault area).
    pub on_refused: Option<RefusedHook>,
}

/// Work run on the proxy thread when a connection's trigger is refused or fails.
pub(crate) type RefusedHook = Box<dyn FnMut(u32) + Send>;

impl ProxyService {
    /// Starts the proxy thread.
    pub(crate) fn launch(task: ProxyTask, name: String) -> std::io::Result<ProxyService> {
        let stop = Arc::new(AtomicBool::new(false));
        let errors = Arc::new(Mutex::new(ErrorLog::default()));
        let thread = std::thread::Builder::new().name(name).spawn({
            let stop = stop.clone();
            let errors = errors.clone();
            move || run(task, &stop, &errors)
        })?;
        Ok(ProxyService {
            stop,
            thread: Some(thread),
            errors,
        })
    }

    /// The first error recorded so far, as text (it is recorded before the trigger that
    /// caused it is popped, so before the kernel's `sync` on that trigger returns).
    pub fn first_error(&self) -> Option<String> {
        let log = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        log.kept.first().map(|e| e.to_string())
    }

    /// Errors so far (up to 64 kept) and how many more were dropped.
    pub fn errors(&self) -> (Vec<String>, u64) {
        let log = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        (
            log.kept.iter().map(|e| e.to_string()).collect(),
            log.dropped,
        )
    }

    /// Asks the thread to drain the FIFO and exit, waits for it, and returns every error
    /// it recorded (empty when all went well).
    pub fn stop(mut self) -> Vec<ProxyError> {
        self.shutdown();
        let mut log = self.errors.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut log.kept)
    }

    fn shutdown(&mut self) {
        // Release: pairs with the thread's acquire load of the flag (nothing else is
        // published through it; the FIFO has its own ordering).
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn record(errors: &Mutex<ErrorLog>, e: ProxyError) {
    let mut log = errors.lock().unwrap_or_else(|e| e.into_inner());
    if log.kept.len() < MAX_KEPT_ERRORS {
        log.kept.push(e);
    } else {
        log.dropped += 1;
    }
}

fn run(mut task: ProxyTask, stop: &AtomicBool, errors: &Mutex<ErrorLog>) {
    if let Some(f) = task.on_start.take() {
        f();
    }
    // When the FIFO last had a trigger (None while busy).
    let mut idle_since: Option<Instant> = None;
    loop {
        // The plane's own work (IB host staging delivers arrived data here).
        match task.plane.progress() {
            Ok(true) => idle_since = None,
            Ok(false) => {}
            Err(error) => record(errors, ProxyError::Progress { error }),
        }
        let Some(trigger) = task.consumer.poll() else {
            // Acquire: see the stop request; then one more poll decides (a trigger
            // published before the request is seen by that poll).
            if stop.load(Ordering::Acquire) && task.consumer.poll().is_none() {
                if let Err(error) = task.plane.progress() {
                    record(errors, ProxyError::Progress { error });
                }
                // Flags the plane still holds back (P2P `cpu` mode) are stored now.
                if let Err(error) = task.plane.finish() {
                    record(errors, ProxyError::Progress { error });
                }
                return;
            }
            let idle = idle_since.get_or_insert_with(Instant::now).elapsed();
            if idle < SPIN_FOR {
                std::hint::spin_loop();
            } else if idle < YIELD_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
            continue;
        };
        idle_since = None;
        let seq = task.consumer.tail();
        let op = trigger.op();
        let id = trigger.connection_id();
        let peer = task.peers.get(id as usize).copied().unwrap_or(usize::MAX);
        // Whether this trigger was refused or failed (reported to the kernel, see above).
        let mut faulted = false;
        let mut fail = |e: ProxyError| {
            faulted = true;
            record(errors, e);
        };
        match task.routes.get(id as usize) {
            None => fail(ProxyError::UnknownConnection {
                seq,
                connection: id,
                known: task.routes.len(),
            }),
            Some(route) => {
                let plane = &mut task.plane;
                let (dst, src, size) = (trigger.dst_offset(), trigger.src_offset(), trigger.size());
                // Relaxed: this thread is the only writer while it runs; the join in `stop`
                // orders it before a later proxy's reads.
                let epoch = op
                    .contains(TriggerOp::FLAG)
                    .then(|| task.epochs[id as usize].fetch_add(1, Ordering::Relaxed) + 1);
                let checked = op
                    .contains(TriggerOp::DATA)
                    .then(|| route.check(dst, src, size));
                let sent = match (checked, epoch) {
                    // A refused put: the signal still goes, so the peer is not left waiting.
                    (Some(Err(error)), epoch) => {
                        fail(ProxyError::OutOfBounds {
                            seq,
                            connection: id,
                            peer,
                            error,
                        });
                        epoch.map_or(Ok(()), |e| plane.signal(route, e))
                    }
                    // Both at once: a plane may send them together (TCP: one write).
                    (Some(Ok(())), Some(e)) => plane.put_with_signal(route, dst, src, size, e),
                    (Some(Ok(())), None) => plane.put(route, dst, src, size),
                    (None, Some(e)) => plane.signal(route, e),
                    (None, None) => Ok(()),
                };
                if let Err(error) = sent {
                    fail(ProxyError::Transport {
                        seq,
                        connection: id,
                        peer,
                        error,
                    });
                }
            }
        }
        if op.contains(TriggerOp::SYNC)
            && let Err(error) = task.plane.flush()
        {
            fail(ProxyError::Transport {
                seq,
                connection: id,
                peer,
                error,
            });
        }
        if faulted {
            // Cold: only after an error. The hook's store happens before the flagged tail
            // the pop below publishes with release, so a kernel that acquires that tail
            // sees the connection's bit.
            if let Some(hook) = task.on_refused.as_mut() {
                hook(id);
            }
            task.consumer.mark_fault();
        }
        // The trigger was polled above, so there is one to pop.
        let _ = task.consumer.pop();
    }
}
