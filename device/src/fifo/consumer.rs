//! The consumer side: [`FifoConsumer`], the proxy's view of the ring. Plain protocol code
//! over `arch`, so it runs on the host proxy thread, under loom, and (unused so far) on a
//! GPU.

use super::device_handle::{FifoConfigError, TAIL_FAULT, check_ptr, check_slots, commit_bit};
use super::trigger::Trigger;
use crate::arch;

/// The single consumer of a trigger FIFO: [`poll`](Self::poll) looks at the slot at the
/// tail, [`pop`](Self::pop) moves past it and publishes the new tail.
///
/// Publication is not batched: every pop release-stores the tail at once. The tail lives
/// in host memory next to the proxy, so the store is a plain local write (the GPU pays for
/// the PCIe read, and only when its cached tail says the ring is full); batching would
/// only delay producers waiting for room and `sync`s.
#[derive(Debug)]
pub struct FifoConsumer {
    triggers: *const Trigger,
    tail: *mut u64,
    slots: u64,
    /// The next sequence number to pop; this value's only writer is `self`, so it is
    /// kept here rather than re-read.
    next: u64,
    /// [`TAIL_FAULT`] once [`mark_fault`](Self::mark_fault) was called, else 0; or-ed into
    /// every published tail.
    fault: u64,
}

// SAFETY: the consumer is addresses into FIFO memory whose liveness `new`'s caller
// guarantees; every shared access goes through `arch` atomics.
unsafe impl Send for FifoConsumer {}
// SAFETY: `&self` methods only load (atomically); the one writer is `pop(&mut self)`.
unsafe impl Sync for FifoConsumer {}

impl FifoConsumer {
    /// The consumer of the FIFO with this ring and tail (addresses in the consumer's
    /// address space), starting at the tail's current value. Checks the slot count and the
    /// pointers as [`FifoDeviceHandle::new`](super::FifoDeviceHandle::new) does.
    ///
    /// # Safety
    /// `triggers` (`slots` triggers) and `tail` must be the memory of one FIFO, live for as
    /// long as this consumer is used, accessed by others only through FIFO handles, and
    /// this must be its only consumer.
    pub unsafe fn new(
        triggers: *const Trigger,
        tail: *mut u64,
        slots: u64,
    ) -> Result<FifoConsumer, FifoConfigError> {
        check_slots(slots)?;
        check_ptr("trigger ring", triggers)?;
        check_ptr("tail", tail as *const u64)?;
        // Acquire: start after whatever a previous consumer popped, having seen what it
        // did. A new consumer starts without the fault bit (the host clears its fault
        // records before starting one); the producers' syncs see it gone at the next pop.
        // SAFETY: `tail` is live and aligned (caller contract, checked alignment).
        let raw = unsafe { arch::ld_acquire_sys_u64(tail) };
        let next = raw & !TAIL_FAULT;
        if raw != next {
            // Release, as in `pop`: we are now the tail's only writer.
            // SAFETY: as above.
            unsafe { arch::st_release_sys_u64(tail, next) };
        }
        Ok(FifoConsumer {
            triggers,
            tail,
            slots,
            next,
            fault: 0,
        })
    }

    /// Number of slots of the ring.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// Sequence number of the next trigger to pop (= the number popped so far).
    pub fn tail(&self) -> u64 {
        self.next
    }

    /// The trigger at the tail if its producer has published it, without consuming it.
    #[inline]
    pub fn poll(&self) -> Option<Trigger> {
        let slot = self
            .triggers
            .wrapping_add((self.next & (self.slots - 1)) as usize) as *const u64;
        // Acquire: pairs with the producer's release (fence, then the slot store), so the
        // low word and every write the producer made before pushing are visible once we
        // see this lap's commit bit.
        // SAFETY: the slot is inside the live ring and aligned (constructor contract).
        let hi = unsafe { arch::ld_acquire_sys_u64(slot.wrapping_add(1)) };
        if hi >> super::trigger::COMMIT_BIT != commit_bit(self.next, self.slots) {
            // Still the previous lap's trigger (or the zeroed initial slot).
            return None;
        }
        // Relaxed: ordered after the acquire above, and the word cannot change before we
        // pop (its next writer waits for our tail). On the GPU both words came from one
        // 16-byte store; on the host the low word was stored before the released high one.
        // SAFETY: as above.
        let lo = unsafe { arch::ld_relaxed_sys_u64(slot) };
        Some(Trigger::from_slot_words(lo, hi))
    }

    /// Consumes the trigger at the tail and publishes the new tail; returns the popped
    /// sequence number, or `None` (changing nothing) when the slot is not published yet.
    /// Call it after acting on the trigger: producers may overwrite the slot, and `sync`
    /// returns, as soon as the tail is published.
    #[inline]
    pub fn pop(&mut self) -> Option<u64> {
        self.poll()?;
        let seq = self.next;
        self.next += 1;
        // Release: our reads of the slot (and whatever the proxy did for the trigger)
        // happen before a producer that acquires this tail overwrites the slot, and
        // before the code after a `sync` on `seq`.
        // SAFETY: `tail` is live and aligned (constructor contract); we are its only
        // writer.
        unsafe { arch::st_release_sys_u64(self.tail, self.next | self.fault) };
        Some(seq)
    }

    /// Sets [`TAIL_FAULT`] in every tail published from now on (the proxy refused or failed
    /// a trigger): the `sync` of that trigger and of every later one reports it. Call it
    /// before popping the faulty trigger, after writing what the producers should read
    /// about the fault (the pop's release store publishes it).
    pub fn mark_fault(&mut self) {
        self.fault = TAIL_FAULT;
    }
}
