//! Drives the device crate's `litmus_fifo_publish` kernel against a [`Fifo`], on a GPU or on
//! CPU threads, while this thread consumes as the proxy does and counts what it must never
//! see: a trigger seen torn (its words from two different pushes) and a trigger seen before
//! the data its thread wrote ahead of the push. The library's way of publishing must show
//! neither; the weakened ways run beside it show what the test can catch (on the GPU; the
//! CPU emulation cannot reorder). Used by `tests/gpu_litmus.rs` and this module's tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_device::arch;
use mscclpp_device::fifo::Trigger;
use mscclpp_device::kernels::fifo_test::{TIMED_OUT, decode_test_trigger, status};
use mscclpp_device::kernels::litmus::{FIFO_DATA_WORDS_PER_THREAD, litmus_fifo_publish};

use super::fifo::{Fifo, OwnedFifoConsumer};
use super::fifo_check::{FifoCheckError, check_backend, on_host_threads, read_status};
use crate::cuda::{CudaError, LaunchConfig, MappedHostBuffer, PushKernelArg};
use crate::smoke::Backend;

/// How the kernel publishes its triggers (`litmus_fifo_publish`'s `variant`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishVariant {
    /// The library's push: `fence.acq_rel.sys`, then one 16-byte store.
    Library = 0,
    /// Weakened: the 16-byte store without the fence.
    NoFence = 1,
    /// Weakened: the fence, then the high word (commit bit) and the low word as two 8-byte
    /// stores.
    HighWordFirst = 2,
}

/// The shape of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishShape {
    /// Blocks of the 1-D grid.
    pub blocks: u32,
    /// Threads per block.
    pub threads: u32,
    /// Triggers each thread pushes.
    pub pushes: u32,
    /// How long the consumer waits for the whole run before giving up.
    pub timeout: Duration,
}

impl PublishShape {
    /// Triggers the run pushes in all.
    pub fn triggers(&self) -> u64 {
        self.blocks as u64 * self.threads as u64 * self.pushes as u64
    }
}

/// What one run counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishCounts {
    /// Triggers popped.
    pub popped: u64,
    /// Triggers that did not decode as one the kernel pushes (seen torn).
    pub torn: u64,
    /// Triggers whose thread's data was older than the push (seen before the data).
    pub stale: u64,
    /// From the launch to the last pop.
    pub elapsed: Duration,
}

/// What the consumer concluded about one popped trigger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Whole, with its thread's data there.
    Good,
    /// Not a trigger the kernel pushes (or outside the shape).
    Torn,
    /// Whole, but its thread's unit held less than `k + 1`.
    Stale,
}

/// Checks a popped trigger against the data buffer as read now (`unit(i)`: word `i` of the
/// buffer, read atomically). A thread's unit only grows (push `k` stores `k + 1` before it),
/// so anything below `k + 1` is data older than the trigger.
pub fn check_published(shape: &PublishShape, t: &Trigger, unit: impl Fn(u64) -> u64) -> Verdict {
    let Some((block, thread, k)) = decode_test_trigger(t) else {
        return Verdict::Torn;
    };
    if block >= shape.blocks || thread >= shape.threads || k >= shape.pushes {
        return Verdict::Torn;
    }
    let at = (block as u64 * shape.threads as u64 + thread as u64) * FIFO_DATA_WORDS_PER_THREAD;
    if unit(at) <= k as u64 || unit(at + 1) <= k as u64 {
        return Verdict::Stale;
    }
    Verdict::Good
}

/// Runs `litmus_fifo_publish` with `variant` against `fifo` on `backend` (a GPU FIFO for
/// [`Backend::Gpu`], a host one for [`Backend::Host`]), consuming on this thread, and
/// returns what it counted. An error only when the run itself failed (a CUDA call, a
/// producer's timeout, triggers missing at the end): violations are counted, not errors.
pub fn run_publish_litmus(
    backend: Backend<'_>,
    fifo: &Fifo,
    shape: &PublishShape,
    variant: PublishVariant,
) -> Result<PublishCounts, FifoCheckError> {
    if shape.triggers() == 0 {
        return Err(FifoCheckError::InvalidArgument(format!(
            "{shape:?} pushes nothing"
        )));
    }
    check_backend(&backend, fifo)?;
    let mut consumer = fifo.consumer()?;
    let threads = shape.blocks as u64 * shape.threads as u64;
    let data_words = (threads * FIFO_DATA_WORDS_PER_THREAD) as usize;
    match backend {
        Backend::Gpu(gpu, module) => {
            let words = MappedHostBuffer::alloc(gpu, status::COUNT * 8)?;
            let data = MappedHostBuffer::alloc(gpu, data_words * 8)?;
            let f = module.function("litmus_fifo_publish")?;
            let stream = gpu.new_stream()?;
            let cfg = LaunchConfig {
                grid_dim: (shape.blocks, 1, 1),
                block_dim: (shape.threads, 1, 1),
                shared_mem_bytes: 0,
            };
            let (arg, dptr, v, sptr) = (
                fifo.kernel_arg(),
                data.device_ptr(),
                variant as u32,
                words.device_ptr(),
            );
            let mut l = stream.launch_builder(&f);
            l.arg(&arg).arg(&dptr).arg(&shape.pushes).arg(&v).arg(&sptr);
            let start = Instant::now();
            // SAFETY: the FIFO, the data and the status words outlive the synchronize
            // below, which also runs when the consumer gives up.
            unsafe { l.launch(cfg) }.map_err(|e| CudaError::driver("cuLaunchKernel", e))?;
            let (status_words, data_ptr) =
                (words.host_ptr() as *mut u64, data.host_ptr() as *mut u64);
            let counted = consume(&mut consumer, shape, start, data_ptr, || {
                // SAFETY: `status_words` holds COUNT live aligned words that the kernel
                // only accesses atomically.
                unsafe { read_status(status_words, threads) }
            });
            stream
                .synchronize()
                .map_err(|e| CudaError::driver("cuStreamSynchronize", e))?;
            counted
        }
        Backend::Host => {
            let mut words = [0u64; status::COUNT];
            let mut data = vec![0u64; data_words];
            let (sptr, dptr) = (words.as_mut_ptr() as usize, data.as_mut_ptr() as usize);
            let handle = fifo.device_handle();
            let start = Instant::now();
            let launch = || {
                // SAFETY: the FIFO, `data` and `words` outlive the run; `data` holds a unit
                // per thread of the grid.
                unsafe {
                    litmus_fifo_publish(
                        handle,
                        dptr as *mut u64,
                        shape.pushes,
                        variant as u32,
                        sptr as *mut u64,
                    )
                }
            };
            on_host_threads(shape.blocks, shape.threads, launch, |ended| {
                consume(&mut consumer, shape, start, dptr as *mut u64, || {
                    // SAFETY: `words` is live for the run and accessed atomically.
                    let (state, seq, _) = unsafe { read_status(sptr as *mut u64, threads) };
                    (state, seq, ended())
                })
            })?
        }
    }
}

/// Pops every trigger of the run, judging each with [`check_published`] against `data`
/// (live for the run, written by the kernel with atomic stores only).
fn consume(
    fifo: &mut OwnedFifoConsumer,
    shape: &PublishShape,
    start: Instant,
    data: *mut u64,
    status: impl Fn() -> (u64, u64, bool),
) -> Result<PublishCounts, FifoCheckError> {
    let expected = shape.triggers();
    let base = fifo.tail();
    let mut counts = PublishCounts::default();
    let mut round = 0u32;
    // SAFETY (the closure): `data` holds a unit per thread of the grid (caller contract) and
    // `check_published` only reads inside it; the kernel writes it atomically.
    let unit =
        |i: u64| unsafe { AtomicU64::from_ptr(data.add(i as usize)) }.load(Ordering::Relaxed);
    while fifo.tail() - base < expected {
        let Some(t) = fifo.poll() else {
            let (state, seq, ended) = status();
            if state == TIMED_OUT {
                return Err(FifoCheckError::KernelTimedOut { seq });
            }
            if (ended && fifo.poll().is_none()) || start.elapsed() > shape.timeout {
                break;
            }
            arch::spin_backoff(round);
            round = round.saturating_add(1);
            continue;
        };
        round = 0;
        match check_published(shape, &t, unit) {
            Verdict::Good => {}
            Verdict::Torn => counts.torn += 1,
            Verdict::Stale => counts.stale += 1,
        }
        fifo.pop()?;
    }
    counts.popped = fifo.tail() - base;
    counts.elapsed = start.elapsed();
    if counts.popped < expected {
        return Err(FifoCheckError::Missing {
            popped: counts.popped,
            expected,
            why: if start.elapsed() > shape.timeout {
                format!("timed out after {:?}", shape.timeout)
            } else {
                "producers ended".into()
            },
        });
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::FifoConfig;
    use mscclpp_device::kernels::fifo_test::test_trigger;

    fn shape() -> PublishShape {
        PublishShape {
            blocks: 3,
            threads: 8,
            pushes: 40,
            timeout: Duration::from_secs(60),
        }
    }

    #[test]
    fn library_publish_on_cpu_threads_counts_nothing_through_many_laps() {
        let fifo = Fifo::new_host(FifoConfig::with_slots(8)).unwrap();
        for _ in 0..2 {
            let c = run_publish_litmus(Backend::Host, &fifo, &shape(), PublishVariant::Library)
                .unwrap();
            assert_eq!((c.popped, c.torn, c.stale), (shape().triggers(), 0, 0));
        }
    }

    #[test]
    fn the_check_names_a_torn_trigger_and_data_older_than_the_push() {
        let s = shape();
        // Thread 5 of block 2 at push 7: its unit must hold at least 8.
        let at = (2 * s.threads as u64 + 5) * FIFO_DATA_WORDS_PER_THREAD;
        let t = test_trigger(2, 5, 7);
        let with = |v: u64| move |i: u64| if i == at || i == at + 1 { v } else { 0 };
        assert_eq!(check_published(&s, &t, with(8)), Verdict::Good);
        assert_eq!(
            check_published(&s, &t, with(9)),
            Verdict::Good,
            "a later push's data"
        );
        assert_eq!(check_published(&s, &t, with(7)), Verdict::Stale);
        let one_word = |i: u64| if i == at { 8 } else { 7 };
        assert_eq!(check_published(&s, &t, one_word), Verdict::Stale);
        // The low word of one push with the high word of another.
        let [lo, _] = test_trigger(1, 3, 7).to_words();
        let [_, hi] = t.to_words();
        assert_eq!(
            check_published(&s, &Trigger::from_words([lo, hi]).unwrap(), with(8)),
            Verdict::Torn
        );
        // Whole, but from outside the run's shape.
        assert_eq!(
            check_published(&s, &test_trigger(3, 0, 0), with(8)),
            Verdict::Torn
        );
    }
}
