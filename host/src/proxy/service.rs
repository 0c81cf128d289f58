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
//! With its FIFO empty, the thread asks the plane for connections whose peer can send
//! nothing more ([`DataPlane::take_gone`]: TCP streams that ended) and runs `on_refused`
//! for each, once, without recording an error: device waits for that peer then give up
//! after a grace (a partner across hosts that left) instead of the device timeout. It
//! also asks for connections that the peer closed after everything it sent had landed
//! ([`DataPlane::take_drained`]) and runs `on_drained` for each, once (the communicator
//! then ends its user handles' waits for a peer that left politely).
//!
//! Idle policy: spin for 200 µs after the last trigger, then yield for 5 ms, then sleep
//! 20 µs between polls, so an idle proxy does not hold a core (CI machines have two) while
//! one in a conversation answers within a poll.
//!
//! Waiters serve too ([`ProxyTask::waiters_serve`], the Host backend): the task sits behind
//! a lock that the thread takes for each turn, and a CPU thread of the process that waits
//! in `spin_backoff` (a CPU kernel waiting for a peer's signal or a flush) takes it when free
//! and serves the published triggers itself, up to the first put of more than
//! [`WAITERS_SEND_MOST`] bytes, in FIFO order. A small put then leaves when its kernel
//! starts waiting, not when the proxy thread next gets a core. The thread starts asleep and
//! leaves such a trigger to the waiters for one poll (serving it at the next when nobody
//! took it); so it sleeps while they serve everything. A helped thread's sleep is a park of
//! up to [`HELPED_PARK`] between polls, ended early by a waiter that leaves it a large put;
//! after serving one it spins and yields as above, for the next pieces.
//!
//! With [`PROXY_STATS_ENV`]`=1` every proxy thread times its work and prints one line to
//! standard error when it stops (see [`ProxyStats`];
//! [`ProxyService::stop_with_stats`] returns them): how many triggers it served, how many
//! were already waiting, and the CPU time each took, to tell a proxy that sets a
//! collective's pace from one that waits for the kernels.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_device::fifo::{Trigger, TriggerOp};

use super::OwnedFifoConsumer;

use crate::transport::error::ProxyError;
use crate::transport::{DataPlane, Route};

/// How long an idle proxy keeps spinning before it starts yielding its core, and how long it
/// yields before it sleeps between polls. Time-based, not count-based: a peer's answer in a
/// ping-pong comes tens of microseconds later, and a proxy asleep by then adds a sleep's
/// granularity to every round trip.
const SPIN_FOR: Duration = Duration::from_micros(200);
const YIELD_FOR: Duration = Duration::from_millis(5);

/// [`SPIN_FOR`], or nothing on a machine of few cores (`machine::few_cores`): there the
/// spinning proxy takes the core from the threads it waits for (the rank's own, the TCP
/// receivers that deliver a peer's data). Host backend, two ranks as two hosts on loopback,
/// 2 cores: 8 B all-reduce took 420 us with the proxies spinning and 13-40 us with them
/// yielding (a yield returns at once when nothing else wants the core, so it costs a system
/// call per poll, not a round trip).
fn spin_for() -> Duration {
    if crate::machine::few_cores() {
        Duration::ZERO
    } else {
        SPIN_FOR
    }
}

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
    /// The work and the errors, shared with the thread and the waiters that help it.
    shared: Arc<Shared>,
    /// The thread's [`ProxyStats`], once it has stopped (when its task asked for them).
    stats: Arc<Mutex<Option<ProxyStats>>>,
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
    /// the trigger is popped, and when the plane finds the connection's peer gone (the
    /// communicator marks the connection in its fault area).
    pub on_refused: Option<RefusedHook>,
    /// Runs on the proxy thread when the plane finds that the peer of a connection closed
    /// it after everything it sent had landed ([`DataPlane::take_drained`]).
    pub on_drained: Option<RefusedHook>,
    /// Asks for passes of [`DataPlane::settle`] and hears when one is done.
    pub settle: Option<SettleHook>,
    /// Time the work and keep [`ProxyStats`] (printed to standard error at the end); the
    /// communicator sets it from [`PROXY_STATS_ENV`].
    pub stats: bool,
    /// Whether CPU threads of this process that wait (in
    /// [`mscclpp_device::arch::spin_backoff`]) may serve this FIFO themselves while the
    /// proxy thread is not at it. Only where nothing needs the proxy thread itself: the
    /// Host backend (a GPU plane's calls need the context that `on_start` binds).
    pub waiters_serve: bool,
}

/// How the communicator asks a proxy to settle its plane ([`DataPlane::settle`]), for the
/// user handles' waits for a peer that left: the proxy checks `asked` whenever its FIFO is
/// empty and, when it grew, settles and then calls `done` with the count it read.
pub(crate) struct SettleHook {
    /// Passes asked for so far.
    pub asked: Box<dyn Fn() -> u64 + Send>,
    /// Runs after a pass that began once `n` passes had been asked for.
    pub done: Box<dyn FnMut(u64) + Send>,
}

/// Work run on the proxy thread when a connection's trigger is refused or fails.
pub(crate) type RefusedHook = Box<dyn FnMut(u32) + Send>;

impl ProxyService {
    /// Starts the proxy thread.
    pub(crate) fn launch(task: ProxyTask, name: String) -> std::io::Result<ProxyService> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Mutex::new(None));
        let helped = task.waiters_serve;
        let shared = Arc::new(Shared {
            core: Mutex::new(Some(Core {
                stats: task.stats.then(ProxyStats::default),
                task,
                first: None,
                just_served: false,
            })),
            errors: Mutex::new(ErrorLog::default()),
            thread: std::sync::OnceLock::new(),
        });
        let thread = std::thread::Builder::new().name(name).spawn({
            let stop = stop.clone();
            let shared = shared.clone();
            let stats = stats.clone();
            move || run(&shared, &stop, &stats)
        })?;
        let _ = shared.thread.set(thread.thread().clone());
        if helped {
            let help: Arc<dyn crate::waiters::Help> = shared.clone();
            crate::waiters::offer(&help);
        }
        Ok(ProxyService {
            stop,
            thread: Some(thread),
            shared,
            stats,
        })
    }

    /// The first error recorded so far, as text (it is recorded before the trigger that
    /// caused it is popped, so before the kernel's `sync` on that trigger returns).
    pub fn first_error(&self) -> Option<String> {
        let log = lock(&self.shared.errors);
        log.kept.first().map(|e| e.to_string())
    }

    /// Errors so far (up to 64 kept) and how many more were dropped.
    pub fn errors(&self) -> (Vec<String>, u64) {
        let log = lock(&self.shared.errors);
        (
            log.kept.iter().map(|e| e.to_string()).collect(),
            log.dropped,
        )
    }

    /// Asks the thread to drain the FIFO and exit, waits for it, and returns every error
    /// it recorded (empty when all went well).
    pub fn stop(self) -> Vec<ProxyError> {
        self.stop_with_stats().0
    }

    /// As [`stop`](Self::stop), also returning the thread's [`ProxyStats`] when its task
    /// kept them ([`PROXY_STATS_ENV`]).
    pub fn stop_with_stats(mut self) -> (Vec<ProxyError>, Option<ProxyStats>) {
        self.shutdown();
        let mut log = lock(&self.shared.errors);
        let stats = lock(&self.stats).take();
        (std::mem::take(&mut log.kept), stats)
    }

    fn shutdown(&mut self) {
        // Release: pairs with the thread's acquire load of the flag (nothing else is
        // published through it; the FIFO has its own ordering).
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // A helped thread may be parked.
            t.thread().unpark();
            let _ = t.join();
            let help: Arc<dyn crate::waiters::Help> = self.shared.clone();
            crate::waiters::withdraw(&help);
        }
    }
}

impl Drop for ProxyService {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn record(errors: &Mutex<ErrorLog>, e: ProxyError) {
    let mut log = lock(errors);
    if log.kept.len() < MAX_KEPT_ERRORS {
        log.kept.push(e);
    } else {
        log.dropped += 1;
    }
}

/// The environment variable that makes every proxy thread print its [`ProxyStats`] to
/// standard error when it stops (`1`; unset or `0`: nothing is timed).
pub const PROXY_STATS_ENV: &str = "MSCCLPP_PROXY_STATS";

/// What a proxy thread did, timed with the monotonic clock around each trigger (only when
/// [`PROXY_STATS_ENV`] is `1`; two clock reads per trigger and step).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ProxyStats {
    /// Triggers served.
    pub triggers: u64,
    /// Of them, with data (puts), and the bytes they asked to move.
    pub puts: u64,
    /// Bytes of the puts.
    pub bytes: u64,
    /// Triggers with a flag (signals).
    pub signals: u64,
    /// Triggers with `SYNC` (flushes).
    pub syncs: u64,
    /// Triggers that were already published when the proxy finished the one before (the
    /// proxy, not the kernel, was late for them): near `triggers`, the proxy sets the pace.
    pub queued: u64,
    /// Time in the plane's put / signal calls (the driver calls on P2P).
    pub plane: Duration,
    /// Time in flushes.
    pub flush: Duration,
    /// Time from polling a trigger to having popped it (plane, flush, checks, pop).
    pub served: Duration,
    /// Time in the plane's `progress` calls that found work (P2P `cpu` mode: flags stored).
    pub progress: Duration,
    /// From the first trigger polled to the last one popped.
    pub span: Duration,
}

impl ProxyStats {
    /// One line: counts, then microseconds per trigger.
    pub fn summary(&self, name: &str) -> String {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / self.triggers.max(1) as f64;
        format!(
            "mscclpp proxy {name}: {} triggers ({} puts of {} bytes, {} signals, {} syncs; {} \
             already waiting) over {:.3} ms; per trigger {:.2} us served, of which {:.2} us in \
             the plane and {:.2} us flushing; progress {:.3} ms; busy {:.0}% of the span",
            self.triggers,
            self.puts,
            self.bytes,
            self.signals,
            self.syncs,
            self.queued,
            self.span.as_secs_f64() * 1e3,
            per(self.served),
            per(self.plane),
            per(self.flush),
            self.progress.as_secs_f64() * 1e3,
            100.0 * (self.served + self.progress).as_secs_f64() / self.span.as_secs_f64().max(1e-9),
        )
    }
}

/// Whether [`PROXY_STATS_ENV`] asks for [`ProxyStats`].
pub(crate) fn stats_wanted() -> bool {
    crate::settings::Settings::global_or_default().proxy_stats
}

/// What the proxy thread shares with the waiting CPU threads that serve its FIFO for it
/// ([`crate::waiters`]).
struct Shared {
    /// The task and the loop's state; `None` once the thread has finished.
    core: Mutex<Option<Core>>,
    errors: Mutex<ErrorLog>,
    /// The proxy thread, for the waiters that leave it work while it is parked.
    thread: std::sync::OnceLock<std::thread::Thread>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

/// The proxy's work: whoever holds it (the thread, or a waiter helping) serves the FIFO.
struct Core {
    task: ProxyTask,
    /// Kept with [`ProxyTask::stats`].
    stats: Option<ProxyStats>,
    /// The first trigger's poll (for the stats' span).
    first: Option<Instant>,
    /// Whether the last poll served a trigger (for the stats' `queued`).
    just_served: bool,
}

impl Core {
    /// Polls the FIFO and serves ([`serve`]) and pops the trigger it finds when `take`
    /// accepts the bytes it puts (0 for a signal or a flush).
    #[inline]
    fn serve_next(&mut self, errors: &Mutex<ErrorLog>, take: impl Fn(u64) -> bool) -> Polled {
        let Some(trigger) = self.task.consumer.poll() else {
            self.just_served = false;
            return Polled::Empty;
        };
        let bytes = if trigger.op().contains(TriggerOp::DATA) {
            trigger.size()
        } else {
            0
        };
        if !take(bytes) {
            self.just_served = false;
            return Polled::Left;
        }
        if let Some(s) = self.stats.as_mut() {
            s.queued += u64::from(self.just_served);
        }
        let t_polled = self.stats.is_some().then(Instant::now);
        if self.first.is_none() {
            self.first = t_polled;
        }
        serve(
            &mut self.task,
            trigger,
            errors,
            self.stats.as_mut(),
            t_polled,
        );
        // The trigger was polled above, so there is one to pop.
        let _ = self.task.consumer.pop();
        if let (Some(s), Some(t), Some(f)) = (self.stats.as_mut(), t_polled, self.first) {
            s.triggers += 1;
            s.served += t.elapsed();
            s.span = f.elapsed();
        }
        self.just_served = true;
        Polled::Served(bytes)
    }
}

/// What [`Core::serve_next`] found.
enum Polled {
    /// No trigger.
    Empty,
    /// A trigger it did not take.
    Left,
    /// A trigger it served, and the bytes it put (0 for a signal or a flush).
    Served(u64),
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The proxy thread: [`run_loop`], then the stats printed and handed over.
fn run(shared: &Shared, stop: &AtomicBool, out: &Mutex<Option<ProxyStats>>) {
    let start = lock(&shared.core)
        .as_mut()
        .and_then(|c| c.task.on_start.take());
    if let Some(f) = start {
        f();
    }
    if let Some(stats) = run_loop(shared, stop) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        crate::diag::eprint_line(&stats.summary(&name));
        *lock(out) = Some(stats);
    }
}

/// The proxy thread's loop: the plane's progress, then a poll of the FIFO; a trigger is
/// served ([`serve`]) and popped, an empty FIFO is an idle turn ([`idle_turn`]) and a wait
/// (spin, yield, sleep), or after the stop request the last turn ([`finish`]), after which
/// the work is dropped here and its stats returned. Each turn holds the work's lock; the
/// waits do not.
fn run_loop(shared: &Shared, stop: &AtomicBool) -> Option<ProxyStats> {
    let errors = &shared.errors;
    let spin_for = spin_for();
    // When the FIFO last had a trigger (None while busy). Where waiters serve, the thread
    // starts asleep: it wakes up for the large puts they leave to it.
    let helped = lock(&shared.core)
        .as_ref()
        .is_some_and(|c| c.task.waiters_serve);
    let mut idle_since = if helped {
        Instant::now().checked_sub(spin_for + YIELD_FOR)
    } else {
        None
    };
    // The FIFO position of the trigger last left to the waiters.
    let mut left: Option<u64> = None;
    let mut idle = IdleState::default();
    loop {
        let mut guard = lock(&shared.core);
        let core = guard.as_mut()?;
        // The plane's own work (IB host staging delivers arrived data here).
        let t_progress = core.stats.is_some().then(Instant::now);
        match core.task.plane.progress() {
            Ok(true) => {
                idle_since = None;
                if let (Some(s), Some(t)) = (core.stats.as_mut(), t_progress) {
                    s.progress += t.elapsed();
                }
            }
            Ok(false) => {}
            Err(error) => record(errors, ProxyError::Progress { error }),
        }
        // Where waiters serve, a trigger they would take is left to them for one poll;
        // still there at the next one, nobody waits for it, and this thread serves it.
        let tail = core.task.consumer.tail();
        let patient = helped && left != Some(tail);
        match core.serve_next(errors, |bytes| !patient || bytes > WAITERS_SEND_MOST) {
            Polled::Served(bytes) => {
                // Helped, only a large put keeps the thread awake (more pieces follow); the
                // small triggers it served were ones nobody waited on.
                if !helped || bytes > WAITERS_SEND_MOST {
                    idle_since = None;
                }
                continue;
            }
            Polled::Left => left = Some(tail),
            Polled::Empty => {}
        }
        // Acquire: see the stop request; then one more poll decides (a trigger published
        // before the request is seen by that poll).
        if stop.load(Ordering::Acquire) && core.task.consumer.poll().is_none() {
            finish(&mut core.task, errors);
            let core = guard.take()?;
            drop(guard);
            return core.stats;
        }
        idle_turn(&mut core.task, errors, &mut idle);
        drop(guard);
        let idle = idle_since.get_or_insert_with(Instant::now).elapsed();
        if helped && idle >= YIELD_FOR {
            // The waiters serve; one that leaves a large put unparks the thread.
            std::thread::park_timeout(HELPED_PARK);
        } else if idle < spin_for {
            std::hint::spin_loop();
        } else if idle < YIELD_FOR {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// The largest put a waiter sends itself ([`crate::waiters`]); larger ones (and everything
/// after them in the FIFO) are left to the proxy thread, which then stays awake for the
/// next ones. Host backend, two ranks as two hosts on loopback, 2 cores, against the proxy
/// thread serving everything: waiters sending puts up to 1 MiB took 0.76-0.89x the time
/// from 8 B to 512 KB but 1.10x at 2 MB (two rounds of 1 MiB puts); up to 64 KiB,
/// 0.83-1.0x from 8 KB up, and at 8 B-2 KB as up to 1 MiB within the noise (8 rounds).
const WAITERS_SEND_MOST: u64 = 256 << 10;

/// How long a helped proxy thread parks between polls of its FIFO: the waiters serve the
/// small triggers and unpark it for the large puts they leave, so the polls are only for
/// triggers that no thread waits on (served within two of them). Host backend, two ranks
/// as two hosts on loopback, 2 cores: sleeping 20 us between polls kept the proxy thread
/// at 15% of a core, woken 50,000 times a second; parked, it took 2%, and 8 B-32 KB
/// all-reduce took 0.49-0.62x the time (9 interleaved rounds), 256 KB-16 MB unchanged.
const HELPED_PARK: Duration = Duration::from_micros(500);

impl crate::waiters::Help for Shared {
    /// Serves every published trigger up to the first put of more than
    /// [`WAITERS_SEND_MOST`] bytes, unless the thread (or another waiter) is serving.
    fn help(&self) -> bool {
        let Ok(mut guard) = self.core.try_lock() else {
            return false;
        };
        let Some(core) = guard.as_mut() else {
            return false;
        };
        let mut found = false;
        loop {
            match core.serve_next(&self.errors, |bytes| bytes <= WAITERS_SEND_MOST) {
                Polled::Served(_) => found = true,
                Polled::Left => {
                    // A large put: the thread's, which may be parked.
                    if let Some(t) = self.thread.get() {
                        t.unpark();
                    }
                    return found;
                }
                Polled::Empty => return found,
            }
        }
    }
}

/// The last turn, after the stop request with the FIFO empty: the plane's last progress,
/// then the flags it still holds back (P2P `cpu` mode) are stored.
#[cold]
fn finish(task: &mut ProxyTask, errors: &Mutex<ErrorLog>) {
    if let Err(error) = task.plane.progress() {
        record(errors, ProxyError::Progress { error });
    }
    if let Err(error) = task.plane.finish() {
        record(errors, ProxyError::Progress { error });
    }
}

/// What [`idle_turn`] keeps between turns.
#[derive(Default)]
struct IdleState {
    /// Connection ids taken from the plane (kept to reuse the allocation).
    ids: Vec<u32>,
    /// Settle passes done (see `SettleHook`).
    settled: u64,
}

/// A turn with the FIFO empty: the connections whose peer can send nothing more, or closed
/// them drained, go to their hooks; a settle pass runs when one was asked for.
#[inline]
fn idle_turn(task: &mut ProxyTask, errors: &Mutex<ErrorLog>, idle: &mut IdleState) {
    // Connections whose peer can send nothing more: marked like refused ones (no error is
    // recorded: a peer that finished first is no fault), so that a wait for such a peer
    // gives up after a grace instead of the device timeout.
    task.plane.take_gone(&mut idle.ids);
    for id in idle.ids.drain(..) {
        if let Some(hook) = task.on_refused.as_mut() {
            hook(id);
        }
    }
    // Connections whose peer closed them with all it sent landed (the communicator ends its
    // user handles' waits for a peer that said goodbye once every such connection to it
    // has).
    task.plane.take_drained(&mut idle.ids);
    for id in idle.ids.drain(..) {
        if let Some(hook) = task.on_drained.as_mut() {
            hook(id);
        }
    }
    // A peer left with its writes complete: deliver what they put here (IB staging) before
    // its user handles' waits give up.
    if let Some(hook) = task.settle.as_mut() {
        let asked = (hook.asked)();
        if asked > idle.settled {
            if let Err(error) = task.plane.settle() {
                record(errors, ProxyError::Progress { error });
            }
            idle.settled = asked;
            (hook.done)(asked);
        }
    }
}

/// Serves one polled trigger (steps 1 to 4 of the [module](self) docs; the caller pops
/// it). `t_polled`: when it was polled, with `stats`.
#[inline]
fn serve(
    task: &mut ProxyTask,
    trigger: Trigger,
    errors: &Mutex<ErrorLog>,
    mut stats: Option<&mut ProxyStats>,
    t_polled: Option<Instant>,
) {
    let seq = task.consumer.tail();
    let op = trigger.op();
    let id = trigger.connection_id();
    let peer = task.peers.get(id as usize).copied().unwrap_or(usize::MAX);
    // Whether this trigger was refused or failed (reported to the kernel, see the module
    // docs).
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
            if let (Some(s), Some(t)) = (stats.as_deref_mut(), t_polled) {
                s.plane += t.elapsed();
                if op.contains(TriggerOp::DATA) {
                    s.puts += 1;
                    s.bytes += size;
                }
                s.signals += u64::from(op.contains(TriggerOp::FLAG));
            }
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
    if op.contains(TriggerOp::SYNC) {
        let t_flush = stats.is_some().then(Instant::now);
        if let Err(error) = task.plane.flush() {
            fail(ProxyError::Transport {
                seq,
                connection: id,
                peer,
                error,
            });
        }
        if let (Some(s), Some(t)) = (stats, t_flush) {
            s.flush += t.elapsed();
            s.syncs += 1;
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Fifo, FifoConfig};
    use crate::transport::host::HostPlane;
    use crate::transport::tests::route;
    use mscclpp_device::fifo::Trigger;

    /// Counts the stats keep for triggers pushed before the proxy starts (all waiting), and
    /// that nothing is kept without asking.
    #[test]
    fn stats_count_what_the_proxy_served() {
        for keep in [true, false] {
            let fifo = Fifo::new_host(FifoConfig::with_slots(16)).unwrap();
            let src = vec![7u8; 256];
            let mut dst = vec![0u8; 256];
            let flag = AtomicU64::new(0);
            let route = route(&src, &mut dst, &flag);
            let handle = fifo.device_handle();
            let ops = [
                (TriggerOp::DATA, 64),
                (TriggerOp::DATA | TriggerOp::FLAG, 32),
                (TriggerOp::FLAG, 0),
                (TriggerOp::DATA | TriggerOp::FLAG | TriggerOp::SYNC, 16),
                (TriggerOp::FLAG | TriggerOp::SYNC, 0),
            ];
            for (i, &(op, size)) in ops.iter().enumerate() {
                let t = Trigger::new(op, 0, 64 * i as u64, 0, size).unwrap();
                // SAFETY: the FIFO lives until the end of the test; 5 of 16 slots.
                unsafe { handle.push(t) };
            }
            let task = ProxyTask {
                consumer: fifo.consumer().unwrap(),
                routes: vec![route],
                epochs: Arc::from(vec![AtomicU64::new(0)]),
                plane: Box::new(HostPlane),
                on_start: None,
                peers: vec![1],
                on_refused: None,
                on_drained: None,
                settle: None,
                stats: keep,
                waiters_serve: false,
            };
            let service = ProxyService::launch(task, "stats-test".into()).unwrap();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while fifo.tail() < ops.len() as u64 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the proxy served {} of {} triggers in 30 s",
                    fifo.tail(),
                    ops.len()
                );
                std::thread::yield_now();
            }
            let (errors, stats) = service.stop_with_stats();
            assert!(errors.is_empty(), "{errors:?}");
            // The puts landed and the last flag is the fourth signal's epoch.
            assert_eq!(&dst[..64], &src[..64]);
            assert_eq!(&dst[64..96], &src[..32]);
            assert_eq!(flag.load(Ordering::Acquire), 4);
            let Some(s) = stats else {
                assert!(!keep, "stats asked for, none kept");
                continue;
            };
            assert!(keep, "stats kept without asking");
            assert_eq!(
                (s.triggers, s.puts, s.bytes, s.signals, s.syncs),
                (5, 3, 112, 4, 2)
            );
            // Every trigger but the first was waiting when the one before was done.
            assert_eq!(s.queued, 4);
            assert!(s.served >= s.plane + s.flush && s.span >= s.served, "{s:?}");
            let line = s.summary("p");
            assert!(line.contains("5 triggers (3 puts of 112 bytes"), "{line}");
        }
    }

    /// A proxy whose thread is held in its start hook, serving `dst` from `src` over the
    /// Host plane; its FIFO holds a put of `big` bytes at offset 0 when `big > 0`, then a
    /// put of 32 bytes with a signal at offset `big`. The hook's sender releases the thread.
    fn held_proxy(
        waiters_serve: bool,
        big: u64,
        src: &[u8],
        dst: &mut [u8],
        flag: &AtomicU64,
    ) -> (Fifo, ProxyService, std::sync::mpsc::Sender<()>) {
        let fifo = Fifo::new_host(FifoConfig::with_slots(16)).unwrap();
        let route = route(src, dst, flag);
        let (release, held) = std::sync::mpsc::channel::<()>();
        let task = ProxyTask {
            consumer: fifo.consumer().unwrap(),
            routes: vec![route],
            epochs: Arc::from(vec![AtomicU64::new(0)]),
            plane: Box::new(HostPlane),
            on_start: Some(Box::new(move || {
                let _ = held.recv_timeout(Duration::from_secs(60));
            })),
            peers: vec![1],
            on_refused: None,
            on_drained: None,
            settle: None,
            stats: false,
            waiters_serve,
        };
        let service = ProxyService::launch(task, "held-proxy".into()).unwrap();
        let handle = fifo.device_handle();
        let mut ops = vec![];
        if big > 0 {
            ops.push(Trigger::new(TriggerOp::DATA, 0, 0, 0, big).unwrap());
        }
        ops.push(Trigger::new(TriggerOp::DATA | TriggerOp::FLAG, 0, big, 0, 32).unwrap());
        for t in ops {
            // SAFETY: the FIFO lives until the end of the test; at most 2 of 16 slots.
            unsafe { handle.push(t) };
        }
        (fifo, service, release)
    }

    /// Waits in `spin_backoff` rounds for up to `limit` until the FIFO's tail reaches `want`:
    /// whether it did.
    fn wait_in_backoff(fifo: &Fifo, want: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut round = 0;
        while fifo.tail() < want {
            if Instant::now() > deadline {
                return false;
            }
            mscclpp_device::arch::spin_backoff(round);
            round = round.saturating_add(1);
        }
        true
    }

    /// A thread that waits serves the put with signal it is waiting for while the proxy
    /// thread cannot (held in its start hook); without `waiters_serve` nothing moves until
    /// the thread runs.
    #[test]
    fn waiters_serve_the_fifo_while_the_proxy_thread_is_away() {
        for waiters_serve in [true, false] {
            let src: Vec<u8> = (0..64u8).collect();
            let mut dst = vec![0u8; 64];
            let flag = AtomicU64::new(0);
            let (fifo, service, release) = held_proxy(waiters_serve, 0, &src, &mut dst, &flag);
            let served = wait_in_backoff(&fifo, 1, Duration::from_millis(300));
            assert_eq!(served, waiters_serve, "waiters_serve {waiters_serve}");
            release.send(()).unwrap();
            assert!(wait_in_backoff(&fifo, 1, Duration::from_secs(30)));
            assert!(service.stop().is_empty());
            assert_eq!(&dst[..32], &src[..32]);
            assert_eq!(flag.load(Ordering::Acquire), 1);
        }
    }

    /// A put larger than `WAITERS_SEND_MOST` is left to the proxy thread, and so is the small
    /// one behind it (the FIFO's order holds).
    #[test]
    fn waiters_leave_large_puts_to_the_proxy_thread() {
        let big = WAITERS_SEND_MOST + 64;
        let src: Vec<u8> = (0..big + 64).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let flag = AtomicU64::new(0);
        let (fifo, service, release) = held_proxy(true, big, &src, &mut dst, &flag);
        assert!(!wait_in_backoff(&fifo, 1, Duration::from_millis(300)));
        assert_eq!(flag.load(Ordering::Acquire), 0);
        release.send(()).unwrap();
        assert!(wait_in_backoff(&fifo, 2, Duration::from_secs(30)));
        assert!(service.stop().is_empty());
        let big = big as usize;
        assert!(dst[..big] == src[..big], "the large put did not land");
        assert_eq!(&dst[big..big + 32], &src[..32]);
        assert_eq!(flag.load(Ordering::Acquire), 1);
    }

    /// Where waiters serve but none waits (a host thread that polls the tail without
    /// `spin_backoff`), the proxy thread still serves a small put with signal.
    #[test]
    fn the_proxy_thread_serves_what_no_waiter_takes() {
        let src: Vec<u8> = (0..64u8).collect();
        let mut dst = vec![0u8; 64];
        let flag = AtomicU64::new(0);
        let (fifo, service, release) = held_proxy(true, 0, &src, &mut dst, &flag);
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while fifo.tail() < 1 {
            if Instant::now() > deadline {
                // Not joined: a thread that never serves it would not drain either.
                std::mem::forget(service);
                panic!("the proxy thread left the put for 30 s");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(service.stop().is_empty());
        assert_eq!(&dst[..32], &src[..32]);
        assert_eq!(flag.load(Ordering::Acquire), 1);
    }
}
