//! [`IbPlane`]: the proxy's data plane over RDMA queue pairs.
//!
//! Per connection (found by [`Route::id`]): a put becomes one RDMA WRITE (split in pieces of
//! at most [`MAX_WRITE`] bytes), a signal an 8-byte inline RDMA WRITE of the epoch to the
//! peer's inbound counter, both on the connection's RC queue pair, so the flag lands after
//! the data. Work requests are numbered per queue pair from 1 (`wr_id`); only every
//! [`IbConfig::signal_every`]-th is signalled, and its completion retires it and everything
//! posted before it (RC completes in order). Before the send queue would overflow, the plane
//! waits for a completion. [`DataPlane::flush`] makes the last posted request signalled (by
//! re-writing the last epoch, which changes nothing at the peer) and waits until it
//! completed, up to [`IbConfig::timeout`].
//!
//! An error completion breaks the connection: the error names it (id, peer rank, tag, queue
//! pair, status) and every later operation on it returns the same error; other connections
//! carry on.
//!
//! A peer that left with its work ended ([`PeerDepartures`], fed by the bootstrap's
//! goodbyes) can deliver nothing more: its connections are reported by
//! [`DataPlane::take_gone`], once each. A reliable-connected queue pair on its own never
//! learns that its peer went away (nothing tells an idle one; a write to it fails only
//! after the retries), so without this a wait for such a peer lasted the device timeout.
//!
//! Links with host staging on either side ([`LinkStaging`]) also copy through the mirror,
//! write records and counts, and deliver arrived data in [`DataPlane::progress`]; see the
//! `staging` module. Every word the plane writes (epoch, count, record, credit) is little
//! endian.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::super::{DataPlane, Route, TransportError};
use super::staging::{
    COUNT_WORD, CREDIT_WORD, EPOCH_WORD, LinkStaging, RING, RING_WORD, StagingCopy, StagingMode,
    decode_record, encode_record, load_le,
};
use super::{Completion, IbError, QueuePair, WriteRequest, WriteSource};

/// Largest single RDMA WRITE (the verbs limit is 2^31 bytes).
pub const MAX_WRITE: u64 = 1 << 30;

/// How long a stopping proxy waits for its last writes to complete ([`DataPlane::finish`]) at
/// most (less when [`IbConfig::timeout`] is shorter): long enough for a full send queue of
/// large writes, short enough that a communicator whose peer died stops promptly.
pub(crate) const FINISH_WAIT: Duration = Duration::from_secs(2);

/// Settings of an [`IbPlane`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IbConfig {
    /// Send-queue depth of each queue pair.
    pub depth: u32,
    /// One work request in this many is signalled (1 = all).
    pub signal_every: u32,
    /// How long `flush` (or a full send queue, or a full staging ring) waits.
    pub timeout: Duration,
    /// When buffers go through host staging (see the `staging` module;
    /// `MSCCLPP_IB_STAGING` overrides it).
    pub staging: StagingMode,
}

impl Default for IbConfig {
    fn default() -> Self {
        IbConfig {
            depth: 512,
            signal_every: 32,
            timeout: Duration::from_secs(30),
            staging: StagingMode::Auto,
        }
    }
}

impl IbConfig {
    /// Refuses settings under which the send queue could fill with no signalled request in
    /// it (then nothing would ever complete).
    pub fn validate(&self) -> Result<(), IbError> {
        if self.signal_every == 0 || self.depth < 2 || self.signal_every > self.depth - 1 {
            return Err(IbError::InvalidConfig(format!(
                "signal_every {} must be in 1..depth ({})",
                self.signal_every, self.depth
            )));
        }
        Ok(())
    }
}

/// The ranks that left with their work ended (every write they made has completed), shared
/// between the bootstrap's departure hook and the IB planes of a communicator.
#[derive(Debug, Default)]
pub(crate) struct PeerDepartures {
    left: Mutex<Vec<bool>>,
    /// Whether any rank left since the planes last looked (so an idle proxy's look is one
    /// load).
    news: AtomicBool,
}

impl PeerDepartures {
    /// Notes that `rank` left with its work ended.
    pub(crate) fn note_left(&self, rank: usize) {
        let mut left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        if left.len() <= rank {
            left.resize(rank + 1, false);
        }
        left[rank] = true;
        self.news.store(true, Ordering::Release);
    }

    /// Whether `rank` left with its work ended.
    pub(crate) fn has_left(&self, rank: usize) -> bool {
        let left = self.left.lock().unwrap_or_else(|e| e.into_inner());
        left.get(rank).copied().unwrap_or(false)
    }
}

/// One connection's queue pair and keys, as the plane needs them.
#[derive(Debug, Clone)]
pub struct IbLink {
    /// The connected (RTS) queue pair, shared with the communicator that owns it.
    pub qp: Arc<Mutex<Box<dyn QueuePair>>>,
    /// The peer's rank (for error messages).
    pub peer: usize,
    /// The connection's tag (for error messages).
    pub tag: u32,
    /// Local key of the registration covering the route's local buffer.
    pub lkey: u32,
    /// Remote key of the peer's buffer.
    pub rkey: u32,
    /// Remote key of the peer's inbound counter (or of its control block when the peer is
    /// staged: its flag then goes to the control block's epoch word).
    pub flag_rkey: u32,
    /// Host staging on either side, if any.
    pub staging: Option<LinkStaging>,
}

#[derive(Debug)]
struct LinkState {
    link: IbLink,
    /// `wr_id` of the last posted request (0: none yet).
    posted: u64,
    /// Every request up to this `wr_id` has completed.
    completed: u64,
    /// `wr_id` of the last signalled request.
    last_signaled: u64,
    /// Requests posted since the last signalled one.
    unsignaled: u32,
    /// Last epoch written to the peer's counter (a flush fence writes it again).
    epoch: u64,
    /// Where the last flag went (for the fence).
    flag_addr: Option<u64>,
    /// The peer buffer's start (a zero-byte fence goes there when no flag was written).
    fence_addr: u64,
    /// The first error on this connection; it is unusable afterwards.
    failed: Option<String>,
    /// Whether `take_gone` has reported this connection (its peer left).
    gone_reported: bool,
}

/// The IB data plane; see the module docs.
#[derive(Debug)]
pub struct IbPlane {
    links: Vec<Option<LinkState>>,
    config: IbConfig,
    scratch: Vec<Completion>,
    /// Copies of staged links (required when any link stages its own buffer).
    copier: Option<Box<dyn StagingCopy>>,
    /// Whether any link receives into a staging mirror (then `progress` has work).
    receives_staged: bool,
    /// An inbound staging error met while waiting for credits, reported by the next
    /// `progress`.
    deferred: Option<IbError>,
    /// The ranks that left, when the plane was told where to look.
    departures: Option<Arc<PeerDepartures>>,
}

impl IbPlane {
    /// A plane for `links[id]` (None for connections of other transports); `epochs[id]` is
    /// the last epoch already written on each connection (a relaunched proxy continues).
    pub fn new(
        links: Vec<Option<IbLink>>,
        epochs: &[u64],
        config: IbConfig,
    ) -> Result<IbPlane, IbError> {
        config.validate()?;
        let links: Vec<Option<LinkState>> = links
            .into_iter()
            .enumerate()
            .map(|(i, l)| {
                l.map(|link| LinkState {
                    link,
                    posted: 0,
                    completed: 0,
                    last_signaled: 0,
                    unsignaled: 0,
                    epoch: epochs.get(i).copied().unwrap_or(0),
                    flag_addr: None,
                    fence_addr: 0,
                    failed: None,
                    gone_reported: false,
                })
            })
            .collect();
        let receives_staged = links.iter().flatten().any(|s: &LinkState| {
            s.link
                .staging
                .as_ref()
                .is_some_and(|st| st.mirror.is_some())
        });
        Ok(IbPlane {
            links,
            config,
            scratch: Vec::new(),
            copier: None,
            receives_staged,
            deferred: None,
            departures: None,
        })
    }

    /// Reports the connections of the ranks in `departures` as gone
    /// ([`DataPlane::take_gone`]) once they left.
    pub(crate) fn with_departures(mut self, departures: Arc<PeerDepartures>) -> IbPlane {
        // A rank may have left before this plane was made.
        departures.news.store(true, Ordering::Release);
        self.departures = Some(departures);
        self
    }

    /// Uses `copier` for the copies between staged buffers and their mirrors.
    pub fn with_staging_copy(mut self, copier: Box<dyn StagingCopy>) -> IbPlane {
        self.copier = Some(copier);
        self
    }

    fn copier(&mut self) -> Result<&mut Box<dyn StagingCopy>, IbError> {
        self.copier.as_mut().ok_or_else(|| {
            IbError::InvalidConfig("a staged IB connection needs a staging copier".into())
        })
    }

    fn state(&mut self, id: u32) -> Result<&mut LinkState, IbError> {
        self.links
            .get_mut(id as usize)
            .and_then(Option::as_mut)
            .ok_or(IbError::UnknownConnection(id))
    }

    /// Posts one write on connection `id`, waiting first when the send queue is full.
    fn post(
        &mut self,
        id: u32,
        source: WriteSource,
        remote_addr: u64,
        rkey_of: fn(&IbLink) -> u32,
        force_signal: bool,
    ) -> Result<(), IbError> {
        let config = self.config;
        let scratch = &mut self.scratch;
        let s = self
            .links
            .get_mut(id as usize)
            .and_then(Option::as_mut)
            .ok_or(IbError::UnknownConnection(id))?;
        s.check(id)?;
        if s.posted - s.completed >= config.depth as u64 - 1 {
            let target = s.posted + 2 - config.depth as u64;
            s.wait_until(id, target, config.timeout, scratch)?;
        }
        let wr_id = s.posted + 1;
        let signaled = force_signal || s.unsignaled + 1 >= config.signal_every;
        let wr = WriteRequest {
            wr_id,
            source,
            remote_addr,
            rkey: rkey_of(&s.link),
            signaled,
        };
        let r = s
            .link
            .qp
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .post_write(&wr);
        if let Err(e) = r {
            s.failed = Some(e.to_string());
            return Err(e);
        }
        s.posted = wr_id;
        if signaled {
            s.last_signaled = wr_id;
            s.unsignaled = 0;
        } else {
            s.unsignaled += 1;
        }
        // Reap what is done already (cheap, never waits).
        if s.last_signaled > s.completed {
            s.reap(id, scratch)?;
        }
        Ok(())
    }

    fn flush_link(&mut self, id: u32) -> Result<(), IbError> {
        let s = self.state(id)?;
        s.check(id)?;
        if s.completed == s.posted {
            return Ok(());
        }
        if s.last_signaled < s.posted {
            // Make the last request signalled: re-write the current epoch (the peer's counter
            // already holds it, or will once the earlier flag lands; same queue pair, so in
            // order). With no flag written yet, write 0 over the 0 it holds.
            let (epoch, flag) = (s.epoch, s.flag_addr);
            let addr = match flag {
                Some(a) => a,
                None => return self.fence_without_flag(id),
            };
            self.post(
                id,
                WriteSource::Inline(epoch.to_le_bytes()),
                addr,
                |l| l.flag_rkey,
                true,
            )?;
        }
        self.wait_posted(id)
    }

    /// Waits until every request posted so far on connection `id` has completed.
    fn wait_posted(&mut self, id: u32) -> Result<(), IbError> {
        let (config, scratch) = (self.config, &mut self.scratch);
        let s = self.links[id as usize]
            .as_mut()
            .ok_or(IbError::UnknownConnection(id))?;
        let target = s.posted;
        s.wait_until(id, target, config.timeout, scratch)
    }

    /// Only puts so far and no known flag address: a signalled zero-byte write to the
    /// buffer start retires them (valid for any rkey range).
    fn fence_without_flag(&mut self, id: u32) -> Result<(), IbError> {
        let s = self.state(id)?;
        let addr = s.fence_addr;
        self.post(
            id,
            WriteSource::Registered {
                addr: 0,
                len: 0,
                lkey: 0,
            },
            addr,
            |l| l.rkey,
            true,
        )?;
        self.wait_posted(id)
    }
}

// Host staging (see the `staging` module).
impl IbPlane {
    /// Fails connection `id` with a staging error (later operations report it).
    fn staging_failed(&mut self, id: u32, reason: String) -> IbError {
        match self.links.get_mut(id as usize).and_then(Option::as_mut) {
            Some(s) => {
                s.failed.get_or_insert_with(|| reason.clone());
                IbError::Staging {
                    connection: id,
                    peer: s.link.peer,
                    tag: s.link.tag,
                    reason,
                }
            }
            None => IbError::UnknownConnection(id),
        }
    }

    /// Writes the record of a put of `size` bytes at `dst_offset` into the staged peer's ring,
    /// waiting for a free slot first.
    fn post_record(&mut self, id: u32, dst_offset: u64, size: u64) -> Result<(), IbError> {
        let Some(record) = encode_record(dst_offset, size) else {
            return Err(self.staging_failed(
                id,
                format!("put of {size} bytes at {dst_offset} cannot be recorded (32-bit fields)"),
            ));
        };
        self.wait_credit(id)?;
        let st = self.staging_of(id)?;
        let sent = st.progress.sent.load(Ordering::Relaxed);
        let addr = st.peer_control.0 + (RING_WORD + sent % RING) * 8;
        self.post(
            id,
            WriteSource::Inline(record.to_le_bytes()),
            addr,
            peer_control_rkey,
            false,
        )?;
        st.progress.sent.store(sent + 1, Ordering::Relaxed);
        Ok(())
    }

    fn staging_of(&mut self, id: u32) -> Result<LinkStaging, IbError> {
        self.state(id)?
            .link
            .staging
            .clone()
            .ok_or(IbError::UnknownConnection(id))
    }

    /// Writes the number of records sent into the staged peer's count word, if it changed.
    fn publish(&mut self, id: u32) -> Result<(), IbError> {
        let st = self.staging_of(id)?;
        let sent = st.progress.sent.load(Ordering::Relaxed);
        if st.progress.published.load(Ordering::Relaxed) == sent {
            return Ok(());
        }
        self.post(
            id,
            WriteSource::Inline(sent.to_le_bytes()),
            st.peer_control.0 + COUNT_WORD * 8,
            peer_control_rkey,
            false,
        )?;
        st.progress.published.store(sent, Ordering::Relaxed);
        Ok(())
    }

    /// Waits until the staged peer's ring has a free slot (its proxy returns credits as it
    /// copies), publishing our count so it can, and serving our own inbound side meanwhile.
    fn wait_credit(&mut self, id: u32) -> Result<(), IbError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            let st = self.staging_of(id)?;
            // SAFETY: the control block is registered host memory kept by the connection
            // while the proxy runs; its credit word is written only by the peer's NIC.
            let credit = unsafe { load_le(st.control + CREDIT_WORD * 8) };
            let sent = st.progress.sent.load(Ordering::Relaxed);
            if sent.saturating_sub(credit) < RING {
                return Ok(());
            }
            self.publish(id)?;
            {
                // Keep our writes moving (and see errors) while we wait.
                let scratch = &mut self.scratch;
                let s = self.links[id as usize]
                    .as_mut()
                    .ok_or(IbError::UnknownConnection(id))?;
                s.reap(id, scratch)?;
            }
            if let Err(e) = self.progress_inbound() {
                self.deferred.get_or_insert(e);
            }
            spins += 1;
            if spins.is_multiple_of(256) {
                let waited = start.elapsed();
                if waited >= self.config.timeout {
                    return Err(self.staging_failed(
                        id,
                        format!(
                            "the peer's staging ring stayed full for {waited:?} ({RING} records                              sent, none consumed: is the peer's proxy running?)"
                        ),
                    ));
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Serves every link that receives into a staging mirror; the first error.
    fn progress_inbound(&mut self) -> Result<bool, IbError> {
        let mut did = false;
        let mut first = None;
        for id in 0..self.links.len() as u32 {
            let receives = self.links[id as usize].as_ref().is_some_and(|s| {
                s.failed.is_none()
                    && s.link
                        .staging
                        .as_ref()
                        .is_some_and(|st| st.mirror.is_some())
            });
            if receives {
                match self.progress_link(id) {
                    Ok(d) => did |= d,
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
        }
        match first {
            None => Ok(did),
            Some(e) => Err(e),
        }
    }

    /// Copies what the peer recorded since the last call from the mirror into the buffer,
    /// then writes the peer's epoch to the inbound counter (same stream, after the copies);
    /// returns credits when a quarter of the ring was consumed.
    fn progress_link(&mut self, id: u32) -> Result<bool, IbError> {
        let st = self.staging_of(id)?;
        let Some((mirror, _)) = st.mirror else {
            return Ok(false);
        };
        {
            // Our own writes (credits) execute and complete without a flush.
            let scratch = &mut self.scratch;
            let s = self.links[id as usize]
                .as_mut()
                .ok_or(IbError::UnknownConnection(id))?;
            if s.last_signaled > s.completed {
                s.reap(id, scratch)?;
            }
        }
        // SAFETY (both loads): the control block is registered host memory kept by the
        // connection while the proxy runs; these words are written only by the peer's NIC.
        // Epoch first: the count read after it covers every put before that signal.
        let epoch = unsafe { load_le(st.control + EPOCH_WORD * 8) };
        let count = unsafe { load_le(st.control + COUNT_WORD * 8) };
        let p = &st.progress;
        let consumed = p.consumed.load(Ordering::Relaxed);
        let delivered = p.delivered.load(Ordering::Relaxed);
        if count == consumed && epoch <= delivered {
            return Ok(false);
        }
        if count < consumed || count - consumed > RING {
            return Err(self.staging_failed(
                id,
                format!("the peer's record count went from {consumed} to {count} (ring of {RING})"),
            ));
        }
        for i in consumed..count {
            // SAFETY: as above; the slot was written before the count that covers it.
            let record = unsafe { load_le(st.control + (RING_WORD + i % RING) * 8) };
            let (offset, size) = decode_record(record);
            if offset + size > st.buffer_len || size == 0 {
                return Err(self.staging_failed(
                    id,
                    format!(
                        "the peer recorded a put of {size} bytes at offset {offset} into a                          buffer of {} bytes",
                        st.buffer_len
                    ),
                ));
            }
            let copied = self
                .copier()?
                .to_buffer(st.buffer + offset, mirror + offset, size);
            if let Err(e) = copied {
                return Err(self.staging_failed(id, format!("copy into the buffer: {e}")));
            }
            p.consumed.store(i + 1, Ordering::Relaxed);
        }
        if epoch > delivered {
            if let Err(e) = self.copier()?.write_flag(st.inbound, epoch) {
                return Err(self.staging_failed(id, format!("writing the inbound counter: {e}")));
            }
            p.delivered.store(epoch, Ordering::Relaxed);
        }
        if count - p.credited.load(Ordering::Relaxed) >= RING / 4 {
            // Signalled: retires itself, so a later flush needs no fence for it.
            self.post(
                id,
                WriteSource::Inline(count.to_le_bytes()),
                st.peer_control.0 + CREDIT_WORD * 8,
                peer_control_rkey,
                true,
            )?;
            p.credited.store(count, Ordering::Relaxed);
        }
        Ok(true)
    }
}

fn peer_control_rkey(l: &IbLink) -> u32 {
    l.staging.as_ref().map_or(0, |s| s.peer_control.1)
}

impl LinkState {
    fn check(&self, id: u32) -> Result<(), IbError> {
        match &self.failed {
            None => Ok(()),
            Some(status) => Err(IbError::Completion {
                connection: id,
                peer: self.link.peer,
                tag: self.link.tag,
                qpn: self.qpn(),
                wr_id: self.completed + 1,
                status: format!("connection already failed: {status}"),
            }),
        }
    }

    fn qpn(&self) -> u32 {
        self.link.qp.lock().unwrap_or_else(|e| e.into_inner()).qpn()
    }

    /// Polls once and retires what completed. An error completion fails the connection.
    fn reap(&mut self, id: u32, scratch: &mut Vec<Completion>) -> Result<(), IbError> {
        scratch.clear();
        let qpn = {
            let mut qp = self.link.qp.lock().unwrap_or_else(|e| e.into_inner());
            qp.poll(scratch)?;
            qp.qpn()
        };
        for c in scratch.drain(..) {
            match c.error {
                None => self.completed = self.completed.max(c.wr_id),
                Some(status) => {
                    let e = IbError::Completion {
                        connection: id,
                        peer: self.link.peer,
                        tag: self.link.tag,
                        qpn,
                        wr_id: c.wr_id,
                        status: status.clone(),
                    };
                    self.failed.get_or_insert(status);
                    // Nothing after a failed request completes usefully (the queue pair is
                    // in the error state); later calls report `failed` instead of waiting.
                    self.completed = self.posted;
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Polls until every request up to `target` completed, or `timeout`.
    fn wait_until(
        &mut self,
        id: u32,
        target: u64,
        timeout: Duration,
        scratch: &mut Vec<Completion>,
    ) -> Result<(), IbError> {
        let start = Instant::now();
        let mut spins = 0u32;
        while self.completed < target {
            self.reap(id, scratch)?;
            if self.completed >= target {
                break;
            }
            spins += 1;
            if spins.is_multiple_of(256) {
                let waited = start.elapsed();
                if waited >= timeout {
                    return Err(IbError::Timeout {
                        connection: id,
                        peer: self.link.peer,
                        tag: self.link.tag,
                        pending: self.posted - self.completed,
                        waited,
                    });
                }
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(())
    }
}

impl DataPlane for IbPlane {
    fn put(
        &mut self,
        route: &Route,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<(), TransportError> {
        route.check(dst_offset, src_offset, size)?;
        let id = route.id;
        let (staging, lkey) = {
            let s = self.state(id)?;
            s.check(id)?;
            s.fence_addr = route.remote;
            (s.link.staging.clone(), s.link.lkey)
        };
        // A staged buffer sends from its mirror: copy the range there first.
        let (source, lkey) = match staging.as_ref().and_then(|st| st.mirror) {
            Some((mirror, mirror_lkey)) => {
                if size > 0 {
                    self.copier()?.to_mirror(
                        mirror + src_offset,
                        route.local + src_offset,
                        size,
                    )?;
                }
                (mirror, mirror_lkey)
            }
            None => (route.local, lkey),
        };
        let mut done = 0;
        while done < size {
            let n = (size - done).min(MAX_WRITE);
            self.post(
                id,
                WriteSource::Registered {
                    addr: source + src_offset + done,
                    len: n as u32,
                    lkey,
                },
                route.remote + dst_offset + done,
                |l| l.rkey,
                false,
            )?;
            done += n;
        }
        // A staged peer copies exactly the recorded ranges out of its mirror.
        if staging.is_some_and(|st| st.peer_staged) && size > 0 {
            self.post_record(id, dst_offset, size)?;
        }
        Ok(())
    }

    fn signal(&mut self, route: &Route, epoch: u64) -> Result<(), TransportError> {
        {
            let s = self.state(route.id)?;
            s.epoch = epoch;
            s.flag_addr = Some(route.remote_flag);
            s.fence_addr = route.remote;
        }
        // A staged peer learns how many records precede this epoch (count before epoch).
        if self
            .state(route.id)?
            .link
            .staging
            .as_ref()
            .is_some_and(|st| st.peer_staged)
        {
            self.publish(route.id)?;
        }
        // Little endian on the wire: the peer reads the counter as a native u64, and every
        // platform this library runs on (x86-64, aarch64, the GPU) is little endian.
        self.post(
            route.id,
            WriteSource::Inline(epoch.to_le_bytes()),
            route.remote_flag,
            |l| l.flag_rkey,
            false,
        )?;
        Ok(())
    }

    /// Completes every write posted so far: a staged peer first learns how many records
    /// precede (its count), then every link with requests in flight is flushed. A stopping
    /// proxy does this before its communicator says goodbye, so that a peer may take what
    /// was sent as landed once the goodbye comes; the wait is bounded by `FINISH_WAIT` (2 s).
    fn finish(&mut self) -> Result<(), TransportError> {
        let mut first = None;
        for id in 0..self.links.len() as u32 {
            let publish = self.links[id as usize].as_ref().is_some_and(|s| {
                s.failed.is_none() && s.link.staging.as_ref().is_some_and(|st| st.peer_staged)
            });
            if publish && let Err(e) = self.publish(id) {
                first.get_or_insert(e);
            }
        }
        let timeout = self.config.timeout;
        // Every wait of the flush reads the timeout from the settings.
        self.config.timeout = timeout.min(FINISH_WAIT);
        let flushed = self.flush();
        self.config.timeout = timeout;
        match first {
            None => flushed,
            Some(e) => Err(e.into()),
        }
    }

    /// The connections of peers that left with their work ended, each once. Their writes
    /// have all completed (the peer's proxy finished before its goodbye), so what they put
    /// here has landed (or sits in a staging mirror until the `settle` that follows).
    fn take_gone(&mut self, gone: &mut Vec<u32>) {
        let Some(d) = &self.departures else {
            return;
        };
        if !d.news.swap(false, Ordering::AcqRel) {
            return;
        }
        for (id, s) in self.links.iter_mut().enumerate() {
            if let Some(s) = s
                && !s.gone_reported
                && d.has_left(s.link.peer)
            {
                s.gone_reported = true;
                gone.push(id as u32);
            }
        }
    }

    /// One pass over every link that receives into a staging mirror (everything that has
    /// landed is copied out and its flag written), then the copies are waited for.
    fn settle(&mut self) -> Result<(), TransportError> {
        if !self.receives_staged {
            return Ok(());
        }
        let pass = self.progress_inbound();
        if let Some(c) = self.copier.as_mut() {
            c.settle()?;
        }
        pass.map(|_| ()).map_err(Into::into)
    }

    fn flush(&mut self) -> Result<(), TransportError> {
        let mut first = None;
        for id in 0..self.links.len() as u32 {
            let pending = self.links[id as usize]
                .as_ref()
                .is_some_and(|s| s.posted > s.completed);
            if pending && let Err(e) = self.flush_link(id) {
                first.get_or_insert(e);
            }
        }
        match first {
            None => Ok(()),
            Some(e) => Err(e.into()),
        }
    }

    fn progress(&mut self) -> Result<bool, TransportError> {
        if let Some(e) = self.deferred.take() {
            return Err(e.into());
        }
        if !self.receives_staged {
            return Ok(false);
        }
        Ok(self.progress_inbound()?)
    }
}
