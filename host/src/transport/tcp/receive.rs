//! The receiving side of a TCP connection: one thread per socket applies the peer's frames
//! (data into the registered buffer, signals into the inbound counter).

use super::*;

/// Why a connection whose peer closed it inside a frame is lost.
const MID_FRAME_CLOSE: &str = "the peer closed the connection in the middle of a frame";

/// Reads from `stream` (whose read timeout is [`POLL`]) into `buf` until at least `min`
/// bytes came; the bytes read. Between frames (`idle`), waiting is unbounded; inside a
/// frame, no progress for the shared timeout is an error, and each read polls for
/// [`POLL_IN_FRAME`] before it blocks.
fn read_at_least(
    stream: &mut TcpStream,
    buf: &mut [u8],
    min: usize,
    idle: bool,
    shared: &Shared,
) -> Result<usize, Stop> {
    let mut got = 0;
    let mut last = Instant::now();
    while got < min {
        if shared.closing.load(Ordering::Acquire) {
            return Err(Stop::Closing);
        }
        if !idle {
            match poll_frame(stream, &mut buf[got..], POLL_IN_FRAME).map_err(|e| match e {
                Stop::Ended => Stop::Lost(MID_FRAME_CLOSE.into()),
                e => e,
            })? {
                0 => {}
                n => {
                    got += n;
                    last = Instant::now();
                    continue;
                }
            }
        }
        match stream.read(&mut buf[got..]) {
            Ok(0) if idle && got == 0 => return Err(Stop::Ended),
            Ok(0) => return Err(Stop::Lost(MID_FRAME_CLOSE.into())),
            Ok(n) => {
                got += n;
                last = Instant::now();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock
                        | io::ErrorKind::TimedOut
                        | io::ErrorKind::Interrupted
                ) =>
            {
                if !(idle && got == 0) && last.elapsed() > shared.timeout {
                    return Err(Stop::Lost(format!(
                        "no data for {:?} in the middle of a frame",
                        shared.timeout
                    )));
                }
            }
            Err(e) => return Err(Stop::Lost(format!("reading: {e}"))),
        }
    }
    Ok(got)
}

/// A stripe's socket with the bytes read ahead of the frame being applied: one read brings
/// a small put's data frame, its payload and its signal frame (four reads without it).
struct Inbox {
    stream: TcpStream,
    buf: Box<[u8]>,
    /// The unapplied bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// How long to poll for a frame before blocking ([`poll_frame`]).
    spin: Duration,
}

impl Inbox {
    /// Bytes read ahead at most, per receiver: less than the kernel's buffer of the same
    /// socket. 16 KiB (with [`DIRECT`](Self::DIRECT) 4 KiB) took 1.1-1.27x the time at
    /// 32 KB-2 MB (Host backend, 2 ranks as 2 hosts on loopback, 2 cores).
    const LEN: usize = 64 << 10;
    /// What is left of a read at least this long goes straight into its destination.
    const DIRECT: usize = 16 << 10;

    fn new(stream: TcpStream, spin: Duration) -> Inbox {
        Inbox {
            stream,
            buf: vec![0u8; Inbox::LEN].into_boxed_slice(),
            start: 0,
            end: 0,
            spin,
        }
    }

    /// Moves read-ahead bytes into `dst`: how many.
    fn take(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.end - self.start);
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.start += n;
        n
    }

    /// Fills `dst` with the stream's next bytes: the read-ahead ones first. `idle`: `dst`
    /// begins a frame (waiting for it is unbounded, and it is polled for first).
    fn read(&mut self, dst: &mut [u8], idle: bool, shared: &Shared) -> Result<(), Stop> {
        // Short of `dst`, `take` leaves nothing read ahead: refills start at the front.
        let mut got = self.take(dst);
        let idle = idle && got == 0;
        if idle && !dst.is_empty() && !self.spin.is_zero() {
            self.start = 0;
            self.end = poll_frame(&self.stream, &mut self.buf, self.spin)?;
            got = self.take(dst);
        }
        let rest = &mut dst[got..];
        let idle = idle && got == 0;
        if rest.len() >= Inbox::DIRECT {
            read_at_least(&mut self.stream, rest, rest.len(), idle, shared)?;
        } else if !rest.is_empty() {
            self.start = 0;
            self.end = read_at_least(&mut self.stream, &mut self.buf, rest.len(), idle, shared)?;
            self.take(rest);
        }
        Ok(())
    }
}

/// How long stripe 0's receiver keeps polling its socket after a frame (yielding the core
/// between polls) before it blocks in a read: stripe 0 carries every signal and every put
/// of one chunk with its signal, and a receiver asleep in the kernel adds a wake-up (on a
/// virtual machine, an interrupt between cores) to each. Host backend, two ranks as two
/// hosts on loopback, 2 cores: polling 200 us made 8 B-4 KB all-reduce 0.70-0.78x the time
/// of blocking at once; 600 us, after the read-ahead, 0.72-0.96x the time of 200 us there
/// and 0.88-1.06x at 32 KB-2 MB (two runs of 6-8 rounds); 1.5-2 ms cost more at large sizes
/// (the pollers take the cores the copies need).
const POLL_AFTER_FRAME: Duration = Duration::from_micros(600);

/// How long a receiver inside a frame polls its socket (yielding between polls) before it
/// blocks in a read. The rest of a long frame comes in pieces (64 KiB segments on loopback);
/// a receiver asleep in the read is woken for each, and the sender's thread pays that
/// wake-up (on a virtual machine, an interrupt to the other core) in its write: at 2 MB
/// (`perf`, both ranks) the kernel's wake-up path went from 10.5% of the samples to 5.0%,
/// the socket copies from 11% to 19%. Host backend, two ranks as two hosts on
/// loopback, 2 cores, 12-16 interleaved rounds: 100 us took 0.83-0.92x the time at 1-16 MB
/// (2 MB: 0.83x, every one of 16 rounds faster) and the same time up to 256 KB; 30 us
/// 0.90-0.94x, 200-500 us no better than 100.
const POLL_IN_FRAME: Duration = Duration::from_micros(100);

/// Reads what has come of the stream (the next frame, or the rest of one) into `buf`
/// without blocking, polling for up to `spin` (yielding between polls) until something
/// has: the bytes read, 0 if nothing came (the caller then blocks in a read), or
/// [`Stop::Ended`] if the peer closed (inside a frame, [`read_at_least`] names that a
/// loss).
fn poll_frame(stream: &TcpStream, buf: &mut [u8], spin: Duration) -> Result<usize, Stop> {
    use rustix::io::Errno;
    use rustix::net::{RecvFlags, recv};
    let start = Instant::now();
    while start.elapsed() < spin {
        match recv(stream, &mut *buf, RecvFlags::DONTWAIT) {
            Ok((_, 0)) => return Err(Stop::Ended),
            Ok((_, n)) => return Ok(n),
            Err(Errno::AGAIN | Errno::INTR) => std::thread::yield_now(),
            Err(e) => return Err(Stop::Lost(format!("reading: {e}"))),
        }
    }
    Ok(0)
}

/// A GPU receiver's staging: the device's context (bound by the receiver thread) and the
/// receiver's slots, on the process's shared receive stream.
pub(super) type RecvStage = (Gpu, Slots);

pub(super) fn cuda_lost(e: CudaError) -> Stop {
    Stop::Lost(format!("staging through host memory: {e}"))
}

/// One stripe's receiver: applies the peer's frames until the connection drops or the peer
/// goes.
pub(super) fn receive(
    stream: TcpStream,
    stripe: usize,
    sink: Sink,
    shared: Arc<Shared>,
    mut stage: Option<RecvStage>,
) {
    let stopped = (|| -> Result<(), Stop> {
        if let Some((gpu, _)) = &stage {
            gpu.bind().map_err(cuda_lost)?;
        }
        let spin = if stripe == 0 {
            POLL_AFTER_FRAME
        } else {
            Duration::ZERO
        };
        let mut inbox = Inbox::new(stream, spin);
        loop {
            let mut hdr = [0u8; HEADER];
            inbox.read(&mut hdr, true, &shared)?;
            let [op, a, b]: [u64; 3] = {
                let mut w = u64s(&hdr);
                [w.next(), w.next(), w.next()].map(|x| x.unwrap_or(0))
            };
            match op {
                OP_DATA => {
                    let (dst, len) = (a, b);
                    if dst.checked_add(len).is_none_or(|end| end > sink.len) {
                        return Err(Stop::Lost(format!(
                            "the peer sent a data frame of length {len} for offset {dst}, \
                             outside the buffer of {} bytes",
                            sink.len
                        )));
                    }
                    match stage.as_mut() {
                        None => {
                            // SAFETY: the range is inside the local buffer (checked above),
                            // which the connection keeps mapped until this thread is joined.
                            // The DevConn contract keeps readers off the range until the
                            // signal after it.
                            let dst = unsafe {
                                std::slice::from_raw_parts_mut(
                                    (sink.buffer + dst) as *mut u8,
                                    len as usize,
                                )
                            };
                            inbox.read(dst, false, &shared)?;
                        }
                        Some((_, slots)) => {
                            let mut off = 0;
                            while off < len {
                                let n = (len - off).min(slots.len() as u64) as usize;
                                let i = slots.take().map_err(cuda_lost)?;
                                inbox.read(slots.bytes(i, n), false, &shared)?;
                                // SAFETY: inside the local device buffer (checked above), which
                                // the connection keeps until this thread is joined, and this
                                // thread waits for its copies before it ends. The DevConn
                                // contract keeps kernels off the range until the signal after
                                // it, which the copy stream writes after this copy.
                                unsafe { slots.drain(i, sink.buffer + dst + off, n) }
                                    .map_err(cuda_lost)?;
                                off += n as u64;
                            }
                        }
                    }
                    // Release: whoever acquires this count sees the bytes written above (or,
                    // staged, the copies queued above: the flag is queued after them).
                    shared.received[stripe].fetch_add(len, Ordering::Release);
                }
                OP_SIGNAL if stripe == 0 && b as usize == shared.received.len() => {
                    let mut raw = vec![0u8; b as usize * 8];
                    inbox.read(&mut raw, false, &shared)?;
                    for (s, want) in u64s(&raw).enumerate() {
                        wait_stripe(&shared, s, want, a)?;
                    }
                    if let Some((_, slots)) = &stage {
                        // SAFETY: `inbound` is an aligned word of the round's device flag
                        // memory, which outlives the connection; this thread waits for the
                        // stream before it ends (below), so the write runs before that.
                        unsafe { write_u64_async(sink.inbound, a, slots.stream()) }
                            .map_err(cuda_lost)?;
                        continue;
                    }
                    // SAFETY: `inbound` is an aligned word of the round's flag memory, which
                    // outlives the connection (and so this thread); it is only accessed
                    // atomically.
                    let flag = unsafe { AtomicU64::from_ptr(sink.inbound as *mut u64) };
                    // Release: the waiter's acquire load of this epoch sees every byte
                    // acquired above.
                    flag.store(a, Ordering::Release);
                }
                OP_SIGNAL => {
                    return Err(Stop::Lost(format!(
                        "the peer sent a signal frame on stripe {stripe} with counts for {b} \
                         stripes (signals come on stripe 0 with {} counts)",
                        shared.received.len()
                    )));
                }
                _ => {
                    return Err(Stop::Lost(format!(
                        "the peer sent an unknown frame (op {op}) on stripe {stripe}"
                    )));
                }
            }
        }
    })();
    end_stripe(stripe, stopped, stage.as_mut(), &shared);
}

/// The end of stripe `stripe`'s receiver, stopped as `stopped` says: its staged copies
/// waited for, the stripe marked ended, and a loss or the peer's close reported.
#[cold]
fn end_stripe(
    stripe: usize,
    stopped: Result<(), Stop>,
    stage: Option<&mut RecvStage>,
    shared: &Shared,
) {
    let mut landed = true;
    if let Some((_, slots)) = stage {
        // The device buffer and the flag may go once this thread is joined: no copy or flag
        // write of this connection may still be queued. The slots' copies are on the same
        // stream, so its synchronize covers them (the stream is shared, so it may hold other
        // connections' work too, which ends on its own).
        if let Err(e) = slots.synchronize() {
            shared.lose(format!("staging through host memory: {e}"));
            landed = false;
        }
    }
    // Release: a signal waiting for this stripe's data (`wait_stripe`) sees the final count.
    shared.ended[stripe].store(true, Ordering::Release);
    match stopped {
        Err(Stop::Lost(why)) => shared.lose(why),
        Err(Stop::Ended) => {
            shared.lose_as("the peer closed the connection".into(), true);
            if landed {
                // Release: whoever acquires the count sees everything this stripe wrote
                // (the staged copies completed above).
                shared.drained.fetch_add(1, Ordering::Release);
            }
        }
        Ok(()) | Err(Stop::Closing) => {}
    }
}

/// Waits until stripe `s` has applied `want` data bytes, which the peer sent before signal
/// `epoch`. Stops only when that stripe's receiver has stopped short of them, when it makes
/// no progress for the timeout, or when the connection is being dropped: not because
/// another stripe ended or a write to the peer failed, since what the peer sent on stripe
/// `s` before it went still lands (a peer that puts, signals and leaves).
pub(super) fn wait_stripe(shared: &Shared, s: usize, want: u64, epoch: u64) -> Result<(), Stop> {
    // Acquire: pairs with the receivers' release of their counts (their bytes are written).
    let mut got = shared.received[s].load(Ordering::Acquire);
    let mut last = Instant::now();
    while got < want {
        if shared.closing.load(Ordering::Acquire) {
            return Err(Stop::Closing);
        }
        // Acquire: pairs with the release in `receive` once the stripe stopped, after its
        // last count, so the count read next is final.
        if shared.ended[s].load(Ordering::Acquire) {
            let got = shared.received[s].load(Ordering::Acquire);
            if got < want {
                return Err(Stop::Lost(format!(
                    "stripe {s} ended after {got} of the {want} bytes sent on it before \
                     signal {epoch}"
                )));
            }
            return Ok(());
        }
        if last.elapsed() > shared.timeout {
            return Err(Stop::Lost(format!(
                "the data before signal {epoch} did not arrive on stripe {s}: {got} of \
                 {want} bytes, none for {:?}",
                shared.timeout
            )));
        }
        std::thread::yield_now();
        let now = shared.received[s].load(Ordering::Acquire);
        if now > got {
            (got, last) = (now, Instant::now());
        }
    }
    Ok(())
}
