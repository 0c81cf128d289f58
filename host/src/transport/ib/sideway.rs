//! [`Verbs`] over the `sideway` crate (cargo feature `ib`).
//!
//! sideway links a small static shim that loads `libibverbs.so.1` at run time, so binaries
//! start without rdma-core installed; [`SidewayVerbs::open`] then reports that it is missing.
//! Queue pairs are basic (`ibv_create_qp`, `ibv_post_send`) RC queue pairs with their own
//! basic completion queue. GPU memory is registered through dma-buf
//! (`cuMemGetHandleForAddressRange` + `ibv_reg_dmabuf_mr`), or through nvidia-peermem
//! (`ibv_reg_mr` on the device address) when dma-buf is refused.
//!
//! sideway panics on values it does not know (an MTU, port state or link layer that a newer
//! driver reports) and asserts in `Drop` that destroying a queue pair or completion queue
//! succeeded. No panic crosses this module: device listing and opening run under
//! `catch_unwind` and become [`IbError::Panicked`]; queue pairs and completion queues are
//! dropped under `catch_unwind` too (a failed destroy leaks them, with a message on stderr),
//! and not at all while the thread is already unwinding (a second panic would abort).
//!
//! Not exercised on hardware: no machine this was written on has an RDMA device.

use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use sideway::ibverbs::AccessFlags;
use sideway::ibverbs::address::{AddressHandleAttribute, Gid};
use sideway::ibverbs::completion::{BasicCompletionQueue, PollCompletionQueueError};
use sideway::ibverbs::device::{DeviceInfo, DeviceList};
use sideway::ibverbs::device_context::{DeviceContext, LinkLayer, Mtu, PortState};
use sideway::ibverbs::protection_domain::ProtectionDomain;
use sideway::ibverbs::queue_pair::{
    BasicQueuePair, PostSendGuard, QueuePair as _, QueuePairAttribute, QueuePairState,
    SetInlineData, SetScatterGatherEntry, WorkRequestFlags,
};

use super::{
    ALTERNATIVES, Completion, IbError, MemoryKind, MemoryRegistration, PortInfo, QpState,
    QpTransition, QueuePair, Selection, Verbs, WriteRequest, WriteSource, check_transition,
    describe_devices, no_device, wc_status_name,
};

/// Whether libibverbs can be loaded in this process.
fn libibverbs_present() -> bool {
    const NAME: &std::ffi::CStr = c"libibverbs.so.1";
    // SAFETY: dlopen with a valid NUL-terminated name; the handle is only closed again (the
    // library stays loaded when sideway's shim holds it too).
    unsafe {
        let h = libc::dlopen(NAME.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
    }
    true
}

/// The text of a caught panic.
fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Runs `f`, turning a panic inside sideway into [`IbError::Panicked`].
fn fenced<T>(
    device: &str,
    call: &'static str,
    f: impl FnOnce() -> Result<T, IbError>,
) -> Result<T, IbError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(IbError::Panicked {
            device: device.to_string(),
            call,
            message: panic_message(p.as_ref()),
        })
    })
}

/// Drops a sideway object without letting its `Drop` panic escape (see the module docs).
fn drop_quietly<T>(what: &str, value: T) {
    if std::thread::panicking() {
        // A panic in a destructor while unwinding aborts the process: leak it instead.
        std::mem::forget(value);
        return;
    }
    if let Err(p) = catch_unwind(AssertUnwindSafe(move || drop(value))) {
        eprintln!(
            "mscclpp: destroying an InfiniBand {what} failed ({}); it is leaked",
            panic_message(p.as_ref())
        );
    }
}

/// Names of the RDMA devices present.
pub(super) fn list_devices() -> Result<Vec<String>, IbError> {
    fenced("?", "listing RDMA devices", list_devices_unfenced)
}

fn list_devices_unfenced() -> Result<Vec<String>, IbError> {
    if !libibverbs_present() {
        return Err(IbError::Unavailable(format!(
            "libibverbs.so.1 cannot be loaded (install rdma-core / libibverbs1, or the vendor's \
             OFED); {ALTERNATIVES}"
        )));
    }
    let list = DeviceList::new().map_err(|e| {
        let os = source(&e);
        // libibverbs answers ENOSYS when the kernel exposes no RDMA devices at all.
        let why = if os.contains("os error 38") {
            "no RDMA device: libibverbs is installed but the kernel exposes no RDMA support \
             (no InfiniBand/RoCE adapter, or ib_uverbs not loaded; check `ibv_devices`)"
                .to_string()
        } else {
            format!("ibv_get_device_list failed: {os}")
        };
        IbError::Unavailable(format!("{why}; {ALTERNATIVES}"))
    })?;
    Ok(list.iter().map(|d| d.name()).collect())
}

/// An opened device, its protection domain and the chosen port.
pub(super) struct SidewayVerbs {
    name: String,
    ctx: Arc<DeviceContext>,
    pd: Arc<ProtectionDomain>,
    port: PortInfo,
}

impl std::fmt::Debug for SidewayVerbs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidewayVerbs")
            .field("name", &self.name)
            .field("port", &self.port)
            .finish()
    }
}

fn verbs_err(device: &str, call: &'static str, e: impl std::fmt::Display) -> IbError {
    IbError::Verbs {
        device: device.to_string(),
        call,
        reason: e.to_string(),
    }
}

fn mtu_bytes(m: Mtu) -> u32 {
    128 << (m as u32)
}

fn mtu_of(bytes: u32) -> Mtu {
    match bytes {
        256 => Mtu::Mtu256,
        512 => Mtu::Mtu512,
        1024 => Mtu::Mtu1024,
        2048 => Mtu::Mtu2048,
        _ => Mtu::Mtu4096,
    }
}

impl SidewayVerbs {
    /// Opens the selected device and port; errors list what was found.
    pub(super) fn open(sel: &Selection) -> Result<SidewayVerbs, IbError> {
        let device = sel.device.as_deref().unwrap_or("the first RDMA device");
        fenced(device, "opening the device and querying its port", || {
            SidewayVerbs::open_unfenced(sel)
        })
    }

    fn open_unfenced(sel: &Selection) -> Result<SidewayVerbs, IbError> {
        let names = list_devices_unfenced()?;
        if names.is_empty() {
            return Err(no_device());
        }
        let index = sel.pick(&names)?;
        let name = names[index].clone();
        let list = DeviceList::new().map_err(|e| verbs_err(&name, "ibv_get_device_list", e))?;
        let dev = list.get(index).ok_or_else(|| IbError::NoSuchDevice {
            wanted: name.clone(),
            found: describe_devices(&names),
        })?;
        let ctx = dev
            .open()
            .map_err(|e| verbs_err(&name, "ibv_open_device", e))?;
        let attr = ctx
            .query_device()
            .map_err(|e| verbs_err(&name, "ibv_query_device", e))?;
        if sel.port == 0 || sel.port > attr.phys_port_cnt() {
            return Err(IbError::Unavailable(format!(
                "{name} has {} port(s); {}={} does not exist",
                attr.phys_port_cnt(),
                super::IB_PORT_ENV,
                sel.port
            )));
        }
        let port = ctx
            .query_port(sel.port)
            .map_err(|e| verbs_err(&name, "ibv_query_port", e))?;
        if port.port_state() != PortState::Active {
            return Err(IbError::Unavailable(format!(
                "port {} of {name} is {:?}, not active (cable, subnet manager?); {ALTERNATIVES}",
                sel.port,
                port.port_state()
            )));
        }
        let gid = ctx
            .query_gid(sel.port, sel.gid_index as u32)
            .map_err(|e| verbs_err(&name, "ibv_query_gid", e))?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| verbs_err(&name, "ibv_alloc_pd", e))?;
        Ok(SidewayVerbs {
            port: PortInfo {
                port: sel.port,
                lid: port.lid(),
                gid: gid.raw,
                gid_index: sel.gid_index,
                mtu: mtu_bytes(port.active_mtu()),
                ethernet: port.link_layer() == LinkLayer::Ethernet,
            },
            name,
            ctx,
            pd,
        })
    }
}

fn access() -> AccessFlags {
    AccessFlags::LocalWrite | AccessFlags::RemoteWrite
}

impl Verbs for SidewayVerbs {
    fn device_name(&self) -> &str {
        &self.name
    }

    fn port(&self) -> PortInfo {
        self.port
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        kind: MemoryKind,
    ) -> Result<MemoryRegistration, IbError> {
        let fail = |memory, reason: String| IbError::Registration {
            device: self.name.clone(),
            memory,
            addr,
            len,
            reason,
        };
        match kind {
            MemoryKind::Host => {
                // SAFETY: the caller guarantees the range stays allocated while registered.
                let mr = unsafe { self.pd.reg_mr(addr as usize, len as usize, access()) }
                    .map_err(|e| fail("host", format!("ibv_reg_mr: {e}: {}", source(&e))))?;
                Ok(MemoryRegistration::new(
                    addr,
                    len,
                    mr.lkey(),
                    mr.rkey(),
                    "host",
                    Box::new(mr),
                ))
            }
            MemoryKind::Gpu => {
                let dmabuf = match crate::cuda::dmabuf_for_range(addr, len) {
                    Ok(d) => {
                        use std::os::fd::AsRawFd;
                        // SAFETY: the fd is a live dma-buf exported for the allocation around
                        // the range, which the caller keeps allocated; iova = the device
                        // address, so work requests use device addresses.
                        let r = unsafe {
                            self.pd.reg_dmabuf_mr(
                                d.offset,
                                len as usize,
                                addr,
                                d.fd.as_raw_fd(),
                                access(),
                            )
                        };
                        // The registration holds its own reference to the dma-buf; our fd
                        // closes when `d` drops.
                        match r {
                            Ok(mr) => return Ok(self.gpu_registration(addr, len, mr, "dma-buf")),
                            Err(e) => format!("ibv_reg_dmabuf_mr: {e}: {}", source(&e)),
                        }
                    }
                    Err(e) => format!("cuMemGetHandleForAddressRange: {e}"),
                };
                // SAFETY: as for host memory; with nvidia-peermem loaded the provider pins
                // the GPU pages behind the device address.
                match unsafe { self.pd.reg_mr(addr as usize, len as usize, access()) } {
                    Ok(mr) => Ok(self.gpu_registration(addr, len, mr, "peermem")),
                    Err(e) => Err(fail(
                        "GPU",
                        format!(
                            "dma-buf failed ({dmabuf}), and ibv_reg_mr on the device address \
                             failed too ({e}: {}; is nvidia-peermem loaded?). GPUDirect RDMA \
                             needs dma-buf (kernel >= 5.12, open GPU kernel modules) or \
                             nvidia-peermem",
                            source(&e)
                        ),
                    )),
                }
            }
        }
    }

    fn create_qp(&self, depth: u32) -> Result<Box<dyn QueuePair>, IbError> {
        let cq = self
            .ctx
            .create_cq_builder()
            .setup_cqe(depth)
            .build()
            .map_err(|e| verbs_err(&self.name, "ibv_create_cq", e))?;
        let qp = self
            .pd
            .create_qp_builder()
            .setup_send_cq(cq.clone())
            .setup_recv_cq(cq.clone())
            .setup_max_send_wr(depth)
            .setup_max_recv_wr(1)
            .setup_max_send_sge(1)
            .setup_max_recv_sge(1)
            .setup_max_inline_data(16)
            .build()
            .map_err(|e| verbs_err(&self.name, "ibv_create_qp", e))?;
        Ok(Box::new(SidewayQp {
            device: self.name.clone(),
            port: self.port,
            qp: ManuallyDrop::new(qp),
            cq: ManuallyDrop::new(cq),
            state: QpState::Reset,
        }))
    }
}

impl SidewayVerbs {
    fn gpu_registration(
        &self,
        addr: u64,
        len: u64,
        mr: Arc<sideway::ibverbs::memory_region::MemoryRegion>,
        method: &'static str,
    ) -> MemoryRegistration {
        MemoryRegistration::new(addr, len, mr.lkey(), mr.rkey(), method, Box::new(mr))
    }
}

/// The OS error under a sideway error, when there is one.
fn source(e: &dyn std::error::Error) -> String {
    let mut s = e.source();
    let mut last = String::new();
    while let Some(x) = s {
        last = x.to_string();
        s = x.source();
    }
    last
}

struct SidewayQp {
    device: String,
    port: PortInfo,
    /// Dropped by hand, queue pair first (see `Drop`).
    qp: ManuallyDrop<BasicQueuePair>,
    cq: ManuallyDrop<Arc<BasicCompletionQueue>>,
    state: QpState,
}

impl Drop for SidewayQp {
    fn drop(&mut self) {
        // SAFETY: each field is taken exactly once, here, and never used again.
        let (qp, cq) = unsafe {
            (
                ManuallyDrop::take(&mut self.qp),
                ManuallyDrop::take(&mut self.cq),
            )
        };
        // sideway asserts that ibv_destroy_qp / ibv_destroy_cq succeed.
        drop_quietly("queue pair", qp);
        drop_quietly("completion queue", cq);
    }
}

impl std::fmt::Debug for SidewayQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SidewayQp")
            .field("device", &self.device)
            .field("qpn", &self.qp.qp_number())
            .field("state", &self.state)
            .finish()
    }
}

impl QueuePair for SidewayQp {
    fn qpn(&self) -> u32 {
        self.qp.qp_number()
    }

    fn state(&self) -> QpState {
        self.state
    }

    fn modify(&mut self, transition: QpTransition<'_>) -> Result<(), IbError> {
        check_transition(self.qpn(), self.state, transition.target())?;
        let mut attr = QueuePairAttribute::new();
        match transition {
            QpTransition::Init => {
                attr.setup_state(QueuePairState::Init)
                    .setup_pkey_index(0)
                    .setup_port(self.port.port)
                    .setup_access_flags(access());
            }
            QpTransition::ReadyToReceive(remote) => {
                let mtu = mtu_of(self.port.mtu.min(remote.mtu));
                attr.setup_state(QueuePairState::ReadyToReceive)
                    .setup_path_mtu(mtu)
                    .setup_dest_qp_num(remote.qpn)
                    .setup_rq_psn(remote.psn)
                    .setup_max_dest_read_atomic(1)
                    .setup_min_rnr_timer(12);
                let mut ah = AddressHandleAttribute::new();
                ah.setup_dest_lid(remote.lid)
                    .setup_port(self.port.port)
                    .setup_service_level(0);
                // RoCE always routes by GID; InfiniBand only when the peer has no LID.
                if self.port.ethernet || remote.lid == 0 {
                    ah.setup_grh_dest_gid(&Gid { raw: remote.gid })
                        .setup_grh_src_gid_index(self.port.gid_index)
                        .setup_grh_hop_limit(255);
                }
                attr.setup_address_vector(&ah);
            }
            QpTransition::ReadyToSend { psn } => {
                attr.setup_state(QueuePairState::ReadyToSend)
                    .setup_sq_psn(psn)
                    // About 1.07 s per try (4.096 us << 18). Six retries, not seven: Soft-RoCE
                    // (rdma_rxe) takes a retry count of 7 as "retry forever", so a write to a
                    // peer whose queue pair is gone never completed there; with 6 it fails
                    // with "transport retry counter exceeded" after about 7 tries.
                    .setup_timeout(18)
                    .setup_retry_cnt(6)
                    .setup_rnr_retry(7)
                    .setup_max_read_atomic(1);
            }
        }
        self.qp.modify(&attr).map_err(|e| {
            verbs_err(
                &self.device,
                "ibv_modify_qp",
                format!("{e}: {}", source(&e)),
            )
        })?;
        self.state = transition.target();
        Ok(())
    }

    fn post_write(&mut self, wr: &WriteRequest) -> Result<(), IbError> {
        if self.state != QpState::ReadyToSend {
            return Err(IbError::NotReadyToSend {
                qpn: self.qpn(),
                state: self.state,
            });
        }
        let mut flags = WorkRequestFlags::none();
        if wr.signaled {
            flags |= WorkRequestFlags::Signaled;
        }
        let mut guard = self.qp.start_post_send();
        let handle = guard
            .construct_wr(wr.wr_id, flags)
            .setup_write(wr.rkey, wr.remote_addr);
        match wr.source {
            WriteSource::Inline(bytes) => handle.setup_inline_data(&bytes),
            // A zero-length write carries no scatter/gather entry (a zero-length entry means
            // 2 GiB on some adapters).
            WriteSource::Registered { len: 0, .. } => {}
            // SAFETY: the range lies in the registration with this lkey (the proxy checked the
            // route, whose local buffer the registration covers), which outlives the plane.
            WriteSource::Registered { addr, len, lkey } => unsafe {
                handle.setup_sge(lkey, addr, len)
            },
        }
        guard.post().map_err(|e| {
            verbs_err(
                &self.device,
                "ibv_post_send",
                format!("{e}: {}", source(&e)),
            )
        })
    }

    fn poll(&mut self, out: &mut Vec<Completion>) -> Result<(), IbError> {
        let poller = match self.cq.start_poll() {
            Ok(p) => p,
            Err(PollCompletionQueueError::CompletionQueueEmpty) => return Ok(()),
            Err(e) => return Err(verbs_err(&self.device, "ibv_poll_cq", e)),
        };
        for wc in poller {
            let status = wc.status();
            out.push(Completion {
                wr_id: wc.wr_id(),
                error: (status != 0).then(|| {
                    format!(
                        "{} (vendor error {:#x})",
                        wc_status_name(status),
                        wc.vendor_err()
                    )
                }),
            });
            if status != 0 {
                self.state = QpState::Error;
            }
        }
        Ok(())
    }
}
