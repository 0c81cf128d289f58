//! The trigger FIFO (docs/guide/06-design.md §4): GPU threads push 16-byte [`Trigger`]s into a
//! ring that a CPU proxy thread pops.
//!
//! - [`Trigger`]: the request, with checked fields ([`Trigger::new`]).
//! - [`FifoDeviceHandle`]: the producer side, a `#[repr(C)]` kernel argument; any number
//!   of threads push at once.
//! - [`FifoConsumer`]: the single consumer (the proxy), polling and popping.
//!
//! The host crate's `Fifo` owns the memory and hands out both.
//!
//! # Trigger layout
//!
//! Two little-endian `u64` words, `lo` at offset 0 and `hi` at offset 8, stored by one
//! 16-byte store on the GPU (on the host: `lo`, then `hi` with release):
//!
//! | word | bits   | field                | limit                                  |
//! |------|--------|----------------------|----------------------------------------|
//! | lo   | 0..32  | source offset        | [`MAX_OFFSET`] = 2³² - 1 (4 GiB buffers) |
//! | lo   | 32..64 | destination offset   | [`MAX_OFFSET`]                         |
//! | hi   | 0..32  | size                 | [`MAX_SIZE`] = 2³² - 1 bytes           |
//! | hi   | 32..42 | connection id        | [`MAX_CONNECTION_ID`] = 1023           |
//! | hi   | 42..45 | operation            | [`TriggerOp`]: DATA 1, FLAG 2, SYNC 4  |
//! | hi   | 45..63 | reserved             | zero                                   |
//! | hi   | 63     | commit (lap parity)  | set by the FIFO, clear in a [`Trigger`] |
//!
//! # Protocol
//!
//! Sequence numbers count pushes from 0; sequence `s` lives in slot `s % slots` during lap
//! `s / slots`. A producer claims `s` with a relaxed atomic add on the head, waits until
//! `s - tail < slots` (first against the device-side cached tail, re-reading the real tail
//! only when the ring looks full), and stores the trigger with the commit bit set to
//! `1 - lap % 2`. The consumer, at tail `t`, acquire-loads the high word of slot
//! `t % slots` and takes the trigger once its commit bit equals `1 - (t / slots) % 2`;
//! zeroed slots read as "lap -1", so no sentinel value is needed and an all-zero trigger
//! is legal. One bit is enough because a slot only ever holds lap `k - 1` (consumed) or lap
//! `k` while the consumer waits on lap `k`: a producer of lap `k + 1` waits for the tail
//! to pass lap `k`. After acting, the consumer release-stores the new tail.
//!
//! Memory ordering (each atomic's reason is written next to it):
//! - producer: relaxed `atom.add` on the head; relaxed read of the cached tail, or an
//!   acquire of the real tail when full; `fence.acq_rel.sys`, then the 16-byte store. The
//!   fence releases the kernel's earlier writes (the data a trigger names) to the proxy
//!   and, with the tail read, acquires the proxy's pop of the slot's previous lap;
//! - consumer: acquire load of the high word, then the low word; release store of the
//!   tail, which `sync` acquires.
//!
//! Waits: every wait on the device (full ring, `sync`, `flush`) gives up after the
//! handle's timeout (`%globaltimer`), with a [`FifoTimeout`] from the `try_` methods or a
//! trap from the others. Model-checked with loom: `device/tests/loom_fifo.rs`.

mod consumer;
mod device_handle;
mod trigger;

pub use consumer::FifoConsumer;
#[cfg(any(test, feature = "test-kernels"))]
pub(crate) use device_handle::Publish;
pub use device_handle::{
    FifoConfigError, FifoDeviceHandle, FifoTimeout, FifoWait, MAX_SLOTS, MAX_TIMEOUT_NS, MIN_SLOTS,
    SyncStatus, SyncStop, TAIL_FAULT, check_slots,
};
pub use trigger::{
    COMMIT_BIT, CONNECTION_ID_BITS, MAX_CONNECTION_ID, MAX_OFFSET, MAX_SIZE, OFFSET_BITS, OP_BITS,
    RESERVED_MASK, SIZE_BITS, Trigger, TriggerError, TriggerField, TriggerOp,
};

#[cfg(all(test, not(target_arch = "nvptx64")))]
mod tests;
