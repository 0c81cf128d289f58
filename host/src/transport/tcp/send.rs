//! The sending side's parallel writers: one thread per stripe but the first, so that a put
//! of several chunks is written to its stripes at once (on loopback and fast links, one
//! thread's copies into the kernel's socket buffers are the limit, not the link).
//!
//! The threads start at a connection's first put of several chunks (a connection that
//! never carries one has none). A put hands each writer the chunks of its stripe (one
//! wake-up per stripe per put, never one per chunk), writes stripe 0's chunks itself, then
//! waits for the writers: when [`DataPlane::put`] returns, every byte is in the sockets, as
//! on the inline path, so the source may be reused and a signal's counts are final.

use super::*;
use std::sync::Condvar;

/// The chunks of one put that go on one stripe: chunk `k` for `k = first, first + step,
/// …` of the put (chunk `k` is `chunk` bytes from `k * chunk`, the last one shorter).
#[derive(Debug, Clone, Copy)]
pub(super) struct Share {
    /// Host address of the put's first byte.
    pub(super) src: u64,
    /// The put's offset in the peer's buffer.
    pub(super) dst: u64,
    /// The put's bytes.
    pub(super) size: u64,
    /// Bytes per chunk.
    pub(super) chunk: u64,
    /// This stripe's first chunk.
    pub(super) first: u64,
    /// Chunks between two of this stripe's (the stripes in the put).
    pub(super) step: u64,
}

impl Share {
    /// The data bytes this share puts on its stripe.
    pub(super) fn bytes(&self) -> u64 {
        let mut total = 0;
        let mut k = self.first;
        while k * self.chunk < self.size {
            total += self.chunk.min(self.size - k * self.chunk);
            k += self.step;
        }
        total
    }

    /// Writes the share's chunks to `stream` as `DATA` frames (`hdr`: scratch for the
    /// header).
    ///
    /// # Safety
    /// `src..src + size` must be host memory that stays valid and unwritten until this
    /// returns.
    pub(super) unsafe fn write(
        &self,
        stream: &mut TcpStream,
        hdr: &mut Vec<u8>,
        shared: &Shared,
    ) -> Result<(), TransportError> {
        let mut k = self.first;
        while k * self.chunk < self.size {
            let off = k * self.chunk;
            let n = self.chunk.min(self.size - off);
            // SAFETY: inside the put's source (caller contract).
            let bytes =
                unsafe { std::slice::from_raw_parts((self.src + off) as *const u8, n as usize) };
            hdr.clear();
            put_u64s(hdr, &[OP_DATA, self.dst + off, n]);
            send(stream, [hdr, bytes], shared)?;
            k += self.step;
        }
        Ok(())
    }
}

/// What a writer thread and the proxy share.
#[derive(Debug, Default)]
struct Slot {
    /// The share to write, until the writer takes it.
    job: Option<Share>,
    /// The outcome of the last share (set by the writer, taken by the proxy).
    done: Option<Result<(), String>>,
    /// The link is dropped: the writer ends.
    stop: bool,
}

#[derive(Debug, Default)]
struct Mailbox {
    slot: Mutex<Slot>,
    ready: Condvar,
}

impl Mailbox {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The writer threads of one connection's stripes `1..` (stopped and joined on drop).
#[derive(Debug)]
pub(super) struct Writers {
    boxes: Vec<Arc<Mailbox>>,
    threads: Vec<JoinHandle<()>>,
}

/// How long the proxy waits for a writer before it looks at the connection again (a write
/// that makes no progress fails on its own, after the socket's write timeout).
const WRITER_POLL: Duration = Duration::from_millis(100);

impl Writers {
    /// Threads writing `streams` (stripes 1, 2, … of the connection with `shared`).
    pub(super) fn start(
        streams: Vec<TcpStream>,
        shared: &Arc<Shared>,
    ) -> Result<Writers, io::Error> {
        let mut w = Writers {
            boxes: Vec::new(),
            threads: Vec::new(),
        };
        for (i, mut stream) in streams.into_iter().enumerate() {
            let mailbox = Arc::new(Mailbox::default());
            let (mb, shared) = (mailbox.clone(), shared.clone());
            let name = format!("mscclpp-tcp-w{}-{}-{}", shared.peer, shared.tag, i + 1);
            // On error, `w` drops: the threads started so far are stopped and joined.
            w.threads
                .push(std::thread::Builder::new().name(name).spawn(move || {
                    let mut hdr = Vec::with_capacity(HEADER);
                    loop {
                        let share = {
                            let mut slot = mb.lock();
                            loop {
                                if slot.stop {
                                    return;
                                }
                                if let Some(s) = slot.job.take() {
                                    break s;
                                }
                                slot = mb.ready.wait(slot).unwrap_or_else(PoisonError::into_inner);
                            }
                        };
                        // SAFETY: the proxy waits for this share's outcome before its put
                        // returns, and the put's source stays valid and unwritten until then
                        // (the put's contract).
                        let r = unsafe { share.write(&mut stream, &mut hdr, &shared) };
                        mb.lock().done = Some(r.map_err(|e| e.to_string()));
                        mb.ready.notify_all();
                    }
                })?);
            w.boxes.push(mailbox);
        }
        Ok(w)
    }

    /// Stripes these threads write (the connection's stripes but the first).
    pub(super) fn len(&self) -> usize {
        self.boxes.len()
    }

    /// Hands stripe `stripe`'s (1 or more) share to its writer.
    pub(super) fn hand(&self, stripe: usize, share: Share) {
        let mb = &self.boxes[stripe - 1];
        let mut slot = mb.lock();
        slot.done = None;
        slot.job = Some(share);
        drop(slot);
        mb.ready.notify_all();
    }

    /// Waits for stripe `stripe`'s writer to finish its share; its error, if it had one.
    /// Bounded: a write that makes no progress fails after the socket's write timeout, and
    /// one to a socket shut down (the connection dropped) fails at once. It waits even then,
    /// since the writer reads the put's source until it is done.
    pub(super) fn finish(&self, stripe: usize) -> Result<(), String> {
        let mb = &self.boxes[stripe - 1];
        let mut slot = mb.lock();
        loop {
            if let Some(r) = slot.done.take() {
                return r;
            }
            slot = mb
                .ready
                .wait_timeout(slot, WRITER_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        for mb in &self.boxes {
            mb.lock().stop = true;
            mb.ready.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
