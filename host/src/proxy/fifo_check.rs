//! Drives the device crate's `fifo_push_test` kernel against a [`Fifo`], on a GPU or on
//! CPU threads, while this thread consumes: every trigger must arrive exactly once and
//! intact. Used by the FIFO's tests and benchmark.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_device::arch::{self, Dim3};
use mscclpp_device::fifo::Trigger;
use mscclpp_device::kernels::fifo_test::{self, TIMED_OUT, decode_test_trigger, status};

use super::fifo::{Fifo, FifoError, OwnedFifoConsumer};
use crate::cuda::{CudaError, LaunchConfig, MappedHostBuffer, PushKernelArg};
use crate::smoke::Backend;

/// The shape of one run of the `fifo_push_test` kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushTest {
    /// Blocks of the 1-D grid.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
    /// Triggers each thread pushes.
    pub pushes: u32,
    /// Whether each thread waits for the proxy after each push (a round trip).
    pub sync_each: bool,
    /// How long the consumer waits for the whole run before giving up.
    pub timeout: Duration,
}

impl PushTest {
    /// Triggers the run pushes in all.
    pub fn triggers(&self) -> u64 {
        self.blocks as u64 * self.threads as u64 * self.pushes as u64
    }
}

/// What a successful run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushTestReport {
    /// Triggers popped (all of them, each once).
    pub triggers: u64,
    /// From the launch to the last pop.
    pub elapsed: Duration,
}

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum FifoCheckError {
    /// A CUDA call failed.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// The CPU-thread launch failed (a thread panicked or trapped).
    #[error(transparent)]
    HostLaunch(#[from] arch::LaunchError),
    /// The FIFO refused an operation.
    #[error(transparent)]
    Fifo(#[from] FifoError),
    /// A GPU backend with a host FIFO or the other way round, or an empty shape.
    #[error("invalid push test: {0}")]
    InvalidArgument(String),
    /// A popped trigger is not one the kernel pushes: corrupted in transit.
    #[error("trigger {seq} is corrupted: {trigger:?}")]
    Corrupt {
        /// Its sequence number.
        seq: u64,
        /// What was popped.
        trigger: Trigger,
    },
    /// A trigger arrived twice.
    #[error("trigger of block {block} thread {thread} push {k} arrived twice (again as {seq})")]
    Duplicate {
        /// Pushing block.
        block: u32,
        /// Pushing thread.
        thread: u32,
        /// Which of its pushes.
        k: u32,
        /// Sequence number of the second arrival.
        seq: u64,
    },
    /// A kernel thread's push or sync timed out.
    #[error("the kernel's FIFO wait for sequence {seq} timed out")]
    KernelTimedOut {
        /// The sequence number it waited on.
        seq: u64,
    },
    /// The producers ended, or the run's timeout passed, before every trigger arrived.
    #[error("{popped} of {expected} triggers arrived ({why})")]
    Missing {
        /// Triggers popped.
        popped: u64,
        /// Triggers pushed.
        expected: u64,
        /// "producers ended" or "timed out after ...".
        why: String,
    },
}

/// Runs `test` against `fifo` on `backend` (a GPU FIFO for [`Backend::Gpu`], a host FIFO
/// for [`Backend::Host`]), consuming on this thread (it takes the FIFO's consumer for the
/// run), and checks every popped trigger. The FIFO may have been used before: the run
/// starts at its current tail.
pub fn run_push_test(
    backend: Backend<'_>,
    fifo: &Fifo,
    test: &PushTest,
) -> Result<PushTestReport, FifoCheckError> {
    if test.triggers() == 0 {
        return Err(FifoCheckError::InvalidArgument(format!(
            "{test:?} pushes nothing"
        )));
    }
    check_backend(&backend, fifo)?;
    let mut consumer = fifo.consumer()?;
    match backend {
        Backend::Gpu(gpu, module) => {
            let words = MappedHostBuffer::alloc(gpu, status::COUNT * 8)?;
            let f = module.function("fifo_push_test")?;
            let stream = gpu.new_stream()?;
            let cfg = LaunchConfig {
                grid_dim: (test.blocks, 1, 1),
                block_dim: (test.threads, 1, 1),
                shared_mem_bytes: 0,
            };
            let (arg, sync_each, ptr) =
                (fifo.kernel_arg(), test.sync_each as u32, words.device_ptr());
            let mut l = stream.launch_builder(&f);
            l.arg(&arg).arg(&test.pushes).arg(&sync_each).arg(&ptr);
            let start = Instant::now();
            // SAFETY: the FIFO and the status words outlive the synchronize below, which
            // also runs when the check fails.
            unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel", e))?;
            let status_words = words.host_ptr() as *mut u64;
            let threads = test.blocks as u64 * test.threads as u64;
            let checked = consume_and_check(&mut consumer, test, start, || {
                // SAFETY: `status_words` holds COUNT live aligned words that the kernel
                // only accesses atomically.
                unsafe { read_status(status_words, threads) }
            });
            stream
                .synchronize()
                .map_err(|e| CudaError::driver("cuStreamSynchronize", e))?;
            checked
        }
        Backend::Host => {
            let mut words = [0u64; status::COUNT];
            let ptr = words.as_mut_ptr() as usize;
            let handle = fifo.device_handle();
            let threads = test.blocks as u64 * test.threads as u64;
            let start = Instant::now();
            let launch = || {
                // SAFETY: the FIFO and `words` outlive the run.
                unsafe {
                    fifo_test::fifo_push_test(
                        handle,
                        test.pushes,
                        test.sync_each as u32,
                        ptr as *mut u64,
                    )
                }
            };
            on_host_threads(test.blocks, test.threads, launch, |ended| {
                consume_and_check(&mut consumer, test, start, || {
                    // SAFETY: `words` is live for the run and accessed atomically.
                    let (state, seq, _) = unsafe { read_status(ptr as *mut u64, threads) };
                    (state, seq, ended())
                })
            })?
        }
    }
}

/// Refuses a GPU backend with a host FIFO and the other way round.
pub(super) fn check_backend(backend: &Backend<'_>, fifo: &Fifo) -> Result<(), FifoCheckError> {
    match (backend, fifo.is_on_gpu()) {
        (Backend::Gpu(..), false) => Err(FifoCheckError::InvalidArgument(
            "GPU backend with a host FIFO (use Fifo::new_gpu)".into(),
        )),
        (Backend::Host, true) => Err(FifoCheckError::InvalidArgument(
            "host backend with a GPU FIFO (use Fifo::new_host)".into(),
        )),
        _ => Ok(()),
    }
}

/// Runs `kernel` on CPU threads (a grid of `blocks` x `threads`, [`arch::launch`]) while
/// `consume` runs on this thread, given a look at whether the grid has ended; returns what
/// `consume` returned once the grid has ended too. An error when a grid thread panicked or
/// trapped.
pub(super) fn on_host_threads<R>(
    blocks: u32,
    threads: u32,
    kernel: impl Fn() + Sync,
    consume: impl FnOnce(&dyn Fn() -> bool) -> R,
) -> Result<R, FifoCheckError> {
    let (launched, out) = std::thread::scope(|s| {
        let grid = s.spawn(|| arch::launch(Dim3::x(blocks), Dim3::x(threads), &kernel));
        let out = consume(&|| grid.is_finished());
        (grid.join(), out)
    });
    match launched {
        Ok(r) => r?,
        Err(_) => {
            return Err(FifoCheckError::InvalidArgument(
                "the host launch thread panicked".into(),
            ));
        }
    }
    Ok(out)
}

/// (state, timed-out sequence, all threads ended) from the kernel's status words.
///
/// # Safety
/// `words` must hold `status::COUNT` live aligned words accessed only atomically.
pub(super) unsafe fn read_status(words: *mut u64, threads: u64) -> (u64, u64, bool) {
    // SAFETY: forwarded to the caller.
    let w = |i| unsafe { AtomicU64::from_ptr(words.add(i)) };
    // Acquire: pairs with the kernel's release add, so a complete count comes with the
    // state and sequence its threads stored before.
    let ended = w(status::FINISHED_THREADS).load(Ordering::Acquire) == threads;
    // Acquire: pairs with the kernel's release store of the state after the sequence.
    let state = w(status::STATE).load(Ordering::Acquire);
    let seq = w(status::TIMED_OUT_SEQ).load(Ordering::Relaxed);
    (state, seq, ended)
}

/// Pops until every trigger of `test` has arrived, checking each; `status` reports the
/// kernel's (state, timed-out sequence, ended). On a failure it keeps popping, without
/// checking, until the producers end or the timeout passes, so that they are not left
/// waiting on a full ring.
fn consume_and_check(
    fifo: &mut OwnedFifoConsumer,
    test: &PushTest,
    start: Instant,
    status: impl Fn() -> (u64, u64, bool),
) -> Result<PushTestReport, FifoCheckError> {
    let expected = test.triggers();
    let base = fifo.tail();
    let popped = |fifo: &OwnedFifoConsumer| fifo.tail() - base;
    let mut seen = vec![false; expected as usize];
    let mut failure: Option<FifoCheckError> = None;
    let mut round = 0u32;
    while popped(fifo) < expected {
        let Some(t) = fifo.poll() else {
            let (state, seq, ended) = status();
            if failure.is_none() && state == TIMED_OUT {
                failure = Some(FifoCheckError::KernelTimedOut { seq });
            }
            // Read the status before polling again: a trigger published before the last
            // thread ended is visible once the end is.
            if ended && fifo.poll().is_none() {
                break;
            }
            if start.elapsed() > test.timeout {
                break;
            }
            arch::spin_backoff(round);
            round = round.saturating_add(1);
            continue;
        };
        round = 0;
        let seq = fifo.tail();
        if failure.is_none() {
            failure = check_one(test, &mut seen, seq, &t).err();
        }
        fifo.pop()?;
    }
    let elapsed = start.elapsed();
    if let Some(f) = failure {
        return Err(f);
    }
    if popped(fifo) < expected {
        let why = if start.elapsed() > test.timeout {
            format!("timed out after {:?}", test.timeout)
        } else {
            "producers ended".into()
        };
        return Err(FifoCheckError::Missing {
            popped: popped(fifo),
            expected,
            why,
        });
    }
    // `expected` distinct triggers each seen once: all of them.
    Ok(PushTestReport {
        triggers: expected,
        elapsed,
    })
}

fn check_one(
    test: &PushTest,
    seen: &mut [bool],
    seq: u64,
    t: &Trigger,
) -> Result<(), FifoCheckError> {
    let corrupt = || FifoCheckError::Corrupt { seq, trigger: *t };
    let (block, thread, k) = decode_test_trigger(t).ok_or_else(corrupt)?;
    if block >= test.blocks || thread >= test.threads || k >= test.pushes {
        return Err(corrupt());
    }
    let i = ((block as u64 * test.threads as u64 + thread as u64) * test.pushes as u64 + k as u64)
        as usize;
    if std::mem::replace(&mut seen[i], true) {
        return Err(FifoCheckError::Duplicate {
            block,
            thread,
            k,
            seq,
        });
    }
    Ok(())
}
