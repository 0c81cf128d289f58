//! The device handles of set-up channels, for kernels.

use mscclpp_device::channel::{DevConn, MemoryChannel};
use mscclpp_device::semaphore::DeviceSemaphore;

use super::{ChannelKind, Communicator, Connection};

/// A [`DevConn`] as a kernel argument for cudarc's launch builder (passed by value). It
/// borrows what the handle borrows (the communicator).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct DevConnArg<'a>(pub DevConn<'a>);

// SAFETY: DevConn is `#[repr(C)]`, `Copy`, and holds only addresses and integers (its
// lifetime is a zero-sized marker), which is what a by-value kernel parameter of the same
// Rust type expects.
unsafe impl cudarc::driver::DeviceRepr for DevConnArg<'_> {}

/// A [`MemoryChannel`] as a kernel argument for cudarc's launch builder (passed by value).
/// It borrows what the handle borrows (the communicator).
#[derive(Debug, Clone, Copy)]
#[repr(transparent)]
pub struct MemoryChannelArg<'a>(pub MemoryChannel<'a>);

// SAFETY: MemoryChannel is `#[repr(C)]`, `Copy`, addresses and integers only (its lifetime
// is a zero-sized marker).
unsafe impl cudarc::driver::DeviceRepr for MemoryChannelArg<'_> {}

impl Communicator {
    /// The device handles of every set-up proxy channel, in `connect` order (pass them to
    /// kernels by value, or copy them to device memory).
    ///
    /// The handles borrow the communicator: the memory they point at (the proxy FIFO, the
    /// counters) is freed when it is dropped, so dropping it while a handle is still used
    /// does not compile (error E0505):
    ///
    /// ```compile_fail,E0505
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn misuse(comm: Communicator) {
    ///     let conns = comm.device_connections();
    ///     drop(comm); // frees the FIFO and the counters
    ///     launch(Dim3::x(1), Dim3::x(1), || {
    ///         conns[0].wait_timeout(1000);
    ///         conns[0].signal();
    ///     })
    ///     .unwrap();
    /// }
    /// ```
    ///
    /// Using them while the communicator lives (starting and stopping the proxy included)
    /// is fine:
    ///
    /// ```no_run
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn good(comm: Communicator) {
    ///     let conns = comm.device_connections();
    ///     comm.proxy_launch().unwrap();
    ///     launch(Dim3::x(1), Dim3::x(1), || {
    ///         conns[0].wait_timeout(1000);
    ///         conns[0].signal();
    ///     })
    ///     .unwrap();
    ///     comm.proxy_stop().unwrap();
    ///     drop(comm);
    /// }
    /// ```
    pub fn device_connections(&self) -> Vec<DevConn<'_>> {
        // SAFETY: the handles borrow `self`, which owns their memory.
        unsafe { self.proxy_handles(true) }
    }

    /// The abort word (its index in the fault area) that the user handles of `c` look at:
    /// the peer's own word ([`FaultArea::note_peer_left`]), written once this side can tell
    /// that everything the peer sent on its connections here has landed. Memory channels,
    /// P2P and Host proxy channels: at its goodbye (the peer itself writes, so all has
    /// landed once its work ended). TCP: once, in addition, the peer closed every stream of
    /// every TCP connection to this rank after its last frame
    /// ([`FaultArea::note_peer_drained`]). IB: the peer's proxy completed its writes before
    /// the goodbye (its plane's `finish`), and where this side stages IB arrivals, its proxy
    /// delivered them in a pass after the goodbye ([`FaultArea::note_settled`]).
    ///
    /// [`FaultArea::note_peer_left`]: super::FaultArea::note_peer_left
    /// [`FaultArea::note_peer_drained`]: super::FaultArea::note_peer_drained
    /// [`FaultArea::note_settled`]: super::FaultArea::note_settled
    fn user_abort_index(&self, c: &Connection) -> usize {
        self.fault.peer_abort_index(c.remote_rank())
    }

    /// [`device_connections`](Self::device_connections) with a lifetime the caller picks,
    /// for code that keeps the handles next to the communicator (e.g. in one struct).
    ///
    /// # Safety
    /// The handles (and their copies) must not be used after this communicator is dropped
    /// (moving it is fine: the memory they point at is owned through heap allocations and
    /// mappings that do not move with it).
    pub(crate) unsafe fn device_connections_detached<'a>(&self) -> Vec<DevConn<'a>> {
        // SAFETY: forwarded to the caller.
        unsafe { self.proxy_handles(false) }
    }

    /// The handles of every set-up proxy channel; `user`: each looks at its peer's abort
    /// word ([`user_abort_index`](Self::user_abort_index)), else at the communicator's (the
    /// collectives, which track departures themselves).
    ///
    /// # Safety
    /// As for [`device_connections_detached`](Self::device_connections_detached).
    unsafe fn proxy_handles<'a>(&self, user: bool) -> Vec<DevConn<'a>> {
        let timeout_ns = self.fifo.device_handle().timeout_ns();
        self.connections
            .iter()
            .filter(|c| c.kind() == ChannelKind::Proxy)
            .map(|c| {
                // SAFETY: the FIFO, the inbound counter and the expected word are owned by
                // this communicator (flag memory is kept in `flag_memory`) and live as long
                // as it; the connection id is the route's index in the proxy; the abort
                // index is a word of the fault area, which holds a per-peer abort word for
                // every rank.
                unsafe {
                    let h = DevConn::from_raw_parts(
                        self.fifo.device_handle(),
                        c.id,
                        c.inbound as *mut u64,
                        c.expected as *mut u64,
                        timeout_ns,
                        self.fault.kernel_ptr(),
                    );
                    if user {
                        h.with_abort_index(self.user_abort_index(c) as u32)
                    } else {
                        h
                    }
                }
            })
            .collect()
    }

    /// The device handles of every set-up memory channel, in `connect_memory` order.
    ///
    /// The handles borrow the communicator (it owns or maps every address in them), so
    /// dropping it while a handle is still used does not compile (error E0505):
    ///
    /// ```compile_fail,E0505
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn misuse(comm: Communicator) {
    ///     let channels = comm.memory_channels();
    ///     drop(comm); // unmaps the peer's buffer and counters
    ///     launch(Dim3::x(1), Dim3::x(1), || channels[0].write::<u64>(0, 1)).unwrap();
    /// }
    /// ```
    ///
    /// ```no_run
    /// use mscclpp_device::arch::{Dim3, launch};
    /// use mscclpp_host::communicator::Communicator;
    ///
    /// fn good(comm: Communicator) {
    ///     let channels = comm.memory_channels();
    ///     launch(Dim3::x(1), Dim3::x(1), || channels[0].write::<u64>(0, 1)).unwrap();
    ///     drop(comm);
    /// }
    /// ```
    pub fn memory_channels(&self) -> Vec<MemoryChannel<'_>> {
        let timeout_ns = self.fifo.device_handle().timeout_ns();
        self.connections
            .iter()
            .filter(|c| c.kind() == ChannelKind::Memory)
            .map(|c| {
                // SAFETY: every address is owned or mapped by this communicator for as long
                // as it lives: the local buffer and packet scratch (kept by the connection),
                // the peer's buffer, scratch and inbound counter (mapped by the connection),
                // and our inbound counter and expected word (flag memory).
                unsafe {
                    let sem = DeviceSemaphore::from_raw_parts(
                        c.inbound as *mut u64,
                        c.route.remote_flag as *mut u64,
                        c.expected as *mut u64,
                        timeout_ns,
                        self.fault
                            .kernel_ptr()
                            .wrapping_add(self.user_abort_index(c)),
                    );
                    MemoryChannel::from_raw_parts(
                        c.route.local as *mut u8,
                        c.route.local_len,
                        c.route.remote as *mut u8,
                        c.route.remote_len,
                        c.packets_in as *mut u8,
                        c.packets_out as *mut u8,
                        c.packets_len,
                        sem,
                    )
                }
            })
            .collect()
    }
}
