//! `FakeVerbs`: an in-process stand-in for an RDMA fabric, for tests. It is a fake, not a
//! model of any NIC: it keeps the verbs rules this transport relies on and moves real bytes.
//!
//! - Every `FakeVerbs` is one "device" on a shared [`FakeFabric`]; registrations get one key
//!   (lkey = rkey), queue pairs get fabric-wide numbers.
//! - Queue pairs follow [`check_transition`]; posting needs RTS, as with the sideway verbs,
//!   which refuse a post once they have seen an error completion (the provider itself would
//!   take it and complete it as flushed); a full send queue refuses the post.
//! - Posted writes execute in order when the queue pair is polled (`completions_per_poll`
//!   at a time; 0 stalls), so flushes really wait. A write checks the local key and range,
//!   that the remote queue pair is connected back and ready, and the remote key and range;
//!   a failure completes with an error (always reported, even for an unsignalled request)
//!   and moves the queue pair to Error, after which everything posted completes as flushed.
//!   Statuses are named as the sideway verbs name them ([`wc_status_name`]), as Soft-RoCE
//!   reported them between two machines: a wrong remote key is status 10 and the requests
//!   behind it status 5, a local range outside its registration status 4. A zero-length
//!   write checks no remote key (it succeeds with a wrong one there too). A peer whose queue
//!   pair is gone fails at once with status 12, where a real one retries first (seconds).
//! - Only signalled requests produce successful completions; a signalled completion frees
//!   the send-queue slots of everything before it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::{
    Completion, IbError, MemoryKind, MemoryRegistration, PortInfo, QpState, QpTransition,
    QueuePair, Verbs, WriteRequest, WriteSource, check_transition, wc_status_name,
};

/// `ibv_wc_status` values the fake reports.
const LOC_PROT_ERR: u32 = 4;
const WR_FLUSH_ERR: u32 = 5;
const REM_ACCESS_ERR: u32 = 10;
const RETRY_EXC_ERR: u32 = 12;

/// An error completion's text: the status as the sideway verbs name it, then what the fake
/// saw.
fn status(code: u32, detail: impl std::fmt::Display) -> String {
    format!("{}: fake: {detail}", wc_status_name(code))
}

#[derive(Debug, Clone, Copy)]
struct Region {
    device: u32,
    addr: u64,
    len: u64,
}

#[derive(Debug, Clone, Copy)]
struct QpEntry {
    device: u32,
    state: QpState,
    remote_qpn: Option<u32>,
}

#[derive(Debug, Default)]
struct Fabric {
    next_qpn: u32,
    next_key: u32,
    next_device: u32,
    regions: HashMap<u32, Region>,
    qps: HashMap<u32, QpEntry>,
}

/// The shared "network" of fake devices.
#[derive(Debug, Default)]
pub(crate) struct FakeFabric {
    state: Mutex<Fabric>,
}

impl FakeFabric {
    pub(crate) fn new() -> Arc<FakeFabric> {
        Arc::new(FakeFabric::default())
    }

    fn lock(&self) -> MutexGuard<'_, Fabric> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Knobs and counters of one fake device, shared with its queue pairs.
#[derive(Debug)]
pub(crate) struct FakeKnobs {
    /// The next registration fails.
    pub(crate) fail_registration: AtomicBool,
    /// Posted writes executed per poll (0: none, a stalled link).
    pub(crate) completions_per_poll: AtomicUsize,
    /// Work requests posted, and how many of them were signalled.
    pub(crate) posted: AtomicU64,
    pub(crate) signaled: AtomicU64,
}

/// A fake RDMA device on a [`FakeFabric`].
#[derive(Debug)]
pub(crate) struct FakeVerbs {
    fabric: Arc<FakeFabric>,
    device: u32,
    name: String,
    pub(crate) knobs: Arc<FakeKnobs>,
}

impl FakeVerbs {
    pub(crate) fn new(fabric: &Arc<FakeFabric>) -> FakeVerbs {
        let device = {
            let mut f = fabric.lock();
            f.next_device += 1;
            f.next_device
        };
        FakeVerbs {
            fabric: fabric.clone(),
            device,
            name: format!("fake_{device}"),
            knobs: Arc::new(FakeKnobs {
                fail_registration: AtomicBool::new(false),
                completions_per_poll: AtomicUsize::new(2),
                posted: AtomicU64::new(0),
                signaled: AtomicU64::new(0),
            }),
        }
    }
}

/// Removes its region from the fabric when the registration is dropped.
#[derive(Debug)]
struct FakeMr {
    fabric: Arc<FakeFabric>,
    key: u32,
}

impl Drop for FakeMr {
    fn drop(&mut self) {
        self.fabric.lock().regions.remove(&self.key);
    }
}

impl Verbs for FakeVerbs {
    fn device_name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> PortInfo {
        PortInfo {
            port: 1,
            lid: self.device as u16,
            gid: [0; 16],
            gid_index: 0,
            mtu: 4096,
            ethernet: false,
        }
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        kind: MemoryKind,
    ) -> Result<MemoryRegistration, IbError> {
        if self.knobs.fail_registration.swap(false, Ordering::Relaxed) || len == 0 {
            return Err(IbError::Registration {
                device: self.name.clone(),
                memory: match kind {
                    MemoryKind::Host => "host",
                    MemoryKind::Gpu => "GPU",
                },
                addr,
                len,
                reason: "fake: registration refused".into(),
            });
        }
        let mut f = self.fabric.lock();
        f.next_key += 1;
        let key = f.next_key;
        f.regions.insert(
            key,
            Region {
                device: self.device,
                addr,
                len,
            },
        );
        let owner = FakeMr {
            fabric: self.fabric.clone(),
            key,
        };
        Ok(MemoryRegistration::new(
            addr,
            len,
            key,
            key,
            "fake",
            Box::new(owner),
        ))
    }

    fn create_qp(&self, depth: u32) -> Result<Box<dyn QueuePair>, IbError> {
        let mut f = self.fabric.lock();
        f.next_qpn += 1;
        let qpn = 0x100 + f.next_qpn;
        f.qps.insert(
            qpn,
            QpEntry {
                device: self.device,
                state: QpState::Reset,
                remote_qpn: None,
            },
        );
        Ok(Box::new(FakeQp {
            fabric: self.fabric.clone(),
            knobs: self.knobs.clone(),
            qpn,
            depth,
            pending: VecDeque::new(),
            in_flight: 0,
            cq: VecDeque::new(),
        }))
    }
}

#[derive(Debug)]
struct FakeQp {
    fabric: Arc<FakeFabric>,
    knobs: Arc<FakeKnobs>,
    qpn: u32,
    depth: u32,
    /// Posted, not executed yet.
    pending: VecDeque<WriteRequest>,
    /// Executed, slot not yet freed by a signalled completion.
    in_flight: usize,
    cq: VecDeque<Completion>,
}

impl Drop for FakeQp {
    fn drop(&mut self) {
        self.fabric.lock().qps.remove(&self.qpn);
    }
}

impl FakeQp {
    /// Executes one write: checks, copies, or returns the error status.
    fn execute(&self, f: &Fabric, wr: &WriteRequest) -> Result<(), String> {
        let me = f
            .qps
            .get(&self.qpn)
            .ok_or_else(|| status(WR_FLUSH_ERR, "queue pair destroyed"))?;
        let remote_qpn = me
            .remote_qpn
            .ok_or_else(|| status(RETRY_EXC_ERR, "not connected"))?;
        let len = wr.source.len();
        if let WriteSource::Registered { addr, lkey, .. } = wr.source
            && len > 0
        {
            match f.regions.get(&lkey) {
                Some(r) if r.device == me.device && covers(r, addr, len) => {}
                _ => {
                    return Err(status(
                        LOC_PROT_ERR,
                        format_args!("lkey {lkey:#x} does not cover {len} bytes at {addr:#x}"),
                    ));
                }
            }
        }
        let remote = f
            .qps
            .get(&remote_qpn)
            .filter(|q| q.remote_qpn == Some(self.qpn))
            .ok_or_else(|| {
                status(
                    RETRY_EXC_ERR,
                    format_args!("queue pair {remote_qpn:#x} does not answer"),
                )
            })?;
        if !matches!(remote.state, QpState::ReadyToReceive | QpState::ReadyToSend) {
            return Err(status(
                RETRY_EXC_ERR,
                format_args!("remote queue pair in {:?}", remote.state),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        match f.regions.get(&wr.rkey) {
            Some(r) if r.device == remote.device && covers(r, wr.remote_addr, len) => {}
            _ => {
                return Err(status(
                    REM_ACCESS_ERR,
                    format_args!(
                        "rkey {:#x} does not cover {len} bytes at {:#x}",
                        wr.rkey, wr.remote_addr
                    ),
                ));
            }
        }
        match wr.source {
            WriteSource::Inline(bytes) if wr.remote_addr.is_multiple_of(8) => {
                // SAFETY: the rkey's registration covers these 8 aligned bytes, and
                // `Verbs::register`'s contract keeps them allocated while it is registered
                // (it is, under the fabric lock). Flags are only accessed atomically.
                let flag =
                    unsafe { std::sync::atomic::AtomicU64::from_ptr(wr.remote_addr as *mut u64) };
                // Release: the data written by earlier requests is visible to an acquire
                // load of this value, as on a real RC queue pair (in order). The bytes land
                // as given (`from_ne_bytes` keeps them): the plane sends little endian.
                flag.store(u64::from_ne_bytes(bytes), Ordering::Release);
            }
            WriteSource::Inline(bytes) => {
                // SAFETY: as above, the 8 bytes are registered memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), wr.remote_addr as *mut u8, 8)
                };
            }
            WriteSource::Registered { addr, .. } => {
                // SAFETY: both ranges are covered by live registrations (checked above; the
                // register contract keeps them allocated); `copy` allows overlap, which two
                // registrations of one process may have.
                unsafe {
                    std::ptr::copy(addr as *const u8, wr.remote_addr as *mut u8, len as usize)
                };
            }
        }
        Ok(())
    }
}

fn covers(r: &Region, addr: u64, len: u64) -> bool {
    addr >= r.addr && addr.checked_add(len).is_some_and(|e| e <= r.addr + r.len)
}

impl QueuePair for FakeQp {
    fn qpn(&self) -> u32 {
        self.qpn
    }

    fn state(&self) -> QpState {
        self.fabric
            .lock()
            .qps
            .get(&self.qpn)
            .map_or(QpState::Error, |q| q.state)
    }

    fn modify(&mut self, transition: QpTransition<'_>) -> Result<(), IbError> {
        let mut f = self.fabric.lock();
        let entry = f
            .qps
            .get_mut(&self.qpn)
            .ok_or(IbError::UnknownConnection(self.qpn))?;
        check_transition(self.qpn, entry.state, transition.target())?;
        if let QpTransition::ReadyToReceive(remote) = transition {
            entry.remote_qpn = Some(remote.qpn);
        }
        entry.state = transition.target();
        Ok(())
    }

    fn post_write(&mut self, wr: &WriteRequest) -> Result<(), IbError> {
        let state = self.state();
        if state != QpState::ReadyToSend {
            return Err(IbError::NotReadyToSend {
                qpn: self.qpn,
                state,
            });
        }
        if self.pending.len() + self.in_flight >= self.depth as usize {
            return Err(IbError::Verbs {
                device: "fake".into(),
                call: "ibv_post_send",
                reason: format!("send queue full ({} requests)", self.depth),
            });
        }
        self.knobs.posted.fetch_add(1, Ordering::Relaxed);
        if wr.signaled {
            self.knobs.signaled.fetch_add(1, Ordering::Relaxed);
        }
        self.pending.push_back(*wr);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), IbError> {
        let n = self.knobs.completions_per_poll.load(Ordering::Relaxed);
        let mut f = self.fabric.lock();
        for _ in 0..n {
            let Some(wr) = self.pending.pop_front() else {
                break;
            };
            let state = f.qps.get(&self.qpn).map_or(QpState::Error, |q| q.state);
            let result = if state == QpState::Error {
                Err(status(WR_FLUSH_ERR, "queue pair in error"))
            } else {
                self.execute(&f, &wr)
            };
            self.in_flight += 1;
            match result {
                Ok(()) if wr.signaled => {
                    self.in_flight = 0;
                    self.cq.push_back(Completion {
                        wr_id: wr.wr_id,
                        error: None,
                    });
                }
                Ok(()) => {}
                Err(status) => {
                    if let Some(q) = f.qps.get_mut(&self.qpn) {
                        q.state = QpState::Error;
                    }
                    self.in_flight = 0;
                    self.cq.push_back(Completion {
                        wr_id: wr.wr_id,
                        error: Some(status),
                    });
                }
            }
        }
        out.extend(self.cq.drain(..));
        Ok(())
    }
}
