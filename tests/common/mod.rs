//! What the test files share: the rank count, the collectives of one rank, the random
//! inputs' hash, and a rank's death by `kill -9`. Each test binary uses part of it.
#![allow(dead_code)] // every test file compiles this module and uses a different part

use mscclpp::host::collectives::RawBuffer;
use std::sync::Arc;
use std::time::Duration;

use mscclpp::host::bootstrap::BlockingBootstrap;
use mscclpp::host::collectives::{CollConfig, Collectives, DataType, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::cuda::CudaStream;
use mscclpp::host::launch::Launch;

/// The variable that tells a re-executed test binary it is a rank.
pub const ROLE: &str = "MSCCLPP_TEST_ROLE";

/// Ranks of each test: `MSCCLPP_TEST_GPUS` (2..=8), else 2.
pub fn test_ranks() -> usize {
    env_number("MSCCLPP_TEST_GPUS", 2..=8, 2) as usize
}

/// The number in environment variable `name`, which must lie in `ok`; `default` when unset.
/// Panics, naming the variable and the range, on anything else.
pub fn env_number(name: &str, ok: std::ops::RangeInclusive<u64>, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) if ok.contains(&n) => n,
            _ => panic!(
                "{name}={v:?}: expected a number in {}..={}",
                ok.start(),
                ok.end()
            ),
        },
        Err(_) => default,
    }
}

/// How long the ranks of one multi-process GPU test may run, in seconds:
/// `MSCCLPP_TEST_TIMEOUT_S` (1 to a day, default 550), so that a run under a shorter outer
/// limit still prints the ranks' output when one hangs.
pub fn test_timeout_s() -> u64 {
    env_number("MSCCLPP_TEST_TIMEOUT_S", 1..=86_400, 550)
}

/// The device timeout of the tests' communicators: a third of [`test_timeout_s`], between
/// 5 and 60 s (60 by default), so that a wait that never ends gives up and says what it
/// waited for before the test's limit kills the ranks.
pub fn device_timeout() -> Duration {
    Duration::from_secs((test_timeout_s() / 3).clamp(5, 60))
}

/// This rank's collectives on its GPU (launched by the test's parent) and a stream.
pub fn setup() -> (Collectives, Arc<CudaStream>) {
    setup_with(CollConfig::default())
}

/// [`setup`] with the collectives' settings `coll`.
pub fn setup_with(coll: CollConfig) -> (Collectives, Arc<CudaStream>) {
    let launch = Launch::from_env().unwrap();
    collectives_on(launch.blocking_bootstrap().unwrap(), coll)
}

/// The collectives with settings `coll` of the rank that `bs` bootstrapped, on its GPU, and
/// a stream.
pub fn collectives_on(bs: BlockingBootstrap, coll: CollConfig) -> (Collectives, Arc<CudaStream>) {
    collectives_timed(bs, coll, device_timeout())
}

/// [`collectives_on`] with the device timeout `timeout` (`MSCCLPP_DEVICE_TIMEOUT`, when
/// set, overrides it).
pub fn collectives_timed(
    bs: BlockingBootstrap,
    coll: CollConfig,
    timeout: Duration,
) -> (Collectives, Arc<CudaStream>) {
    let backend = Backend::auto(bs.local_rank()).unwrap();
    let Backend::Gpu(gpu) = backend.clone() else {
        panic!("rank {} found no GPU", bs.rank())
    };
    let config = CommConfig {
        device_timeout: timeout,
        ..CommConfig::default()
    };
    let comm = Communicator::from_bootstrap(bs, backend, config).unwrap();
    let stream = gpu.new_stream().unwrap();
    (Collectives::new(comm, coll).unwrap(), stream)
}

/// SplitMix64: the inputs' hash.
pub fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The low `dtype.size()` bytes of each word, little-endian, one after the other.
pub fn to_bytes<W: Into<u64>>(
    dtype: mscclpp::host::collectives::DataType,
    words: impl Iterator<Item = W>,
) -> Vec<u8> {
    let size = dtype.size();
    let mut out = Vec::new();
    for w in words {
        out.extend_from_slice(&w.into().to_le_bytes()[..size]);
    }
    out
}

/// [`to_bytes`] of `word(0)`, ..., `word(count - 1)`, computed on up to 8 threads: the
/// sweeps' CPU inputs and references run to 1 GiB, and on one thread they took several
/// seconds per call.
pub fn par_bytes(
    dtype: mscclpp::host::collectives::DataType,
    count: usize,
    word: impl Fn(usize) -> u32 + Sync,
) -> Vec<u8> {
    let size = dtype.size();
    let mut out = vec![0u8; count * size];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(8));
    let per = count.div_ceil(threads).max(1 << 16);
    std::thread::scope(|s| {
        for (k, chunk) in out.chunks_mut(per * size).enumerate() {
            let word = &word;
            s.spawn(move || {
                for (j, e) in chunk.chunks_mut(size).enumerate() {
                    e.copy_from_slice(&u64::from(word(k * per + j)).to_le_bytes()[..size]);
                }
            });
        }
    });
    out
}

/// Element indices whose bytes differ (at most the first few, and the total).
pub fn mismatches(got: &[u8], want: &[u8], size: usize) -> (usize, Vec<usize>) {
    if got == want {
        return (0, Vec::new()); // one memcmp instead of a loop over elements
    }
    let mut first = Vec::new();
    let mut total = 0;
    for (i, (g, w)) in got.chunks(size).zip(want.chunks(size)).enumerate() {
        if g != w {
            total += 1;
            if first.len() < 5 {
                first.push(i);
            }
        }
    }
    (total, first)
}

/// A slice's device address (its use is ordered on `stream`).
pub fn dptr<T>(s: &mscclpp::host::cuda::CudaSlice<T>, stream: &CudaStream) -> u64 {
    use cudarc::driver::DevicePtr;
    let (p, _g) = s.device_ptr(stream);
    p
}

/// Queues an in-place f32 sum all-reduce (`AllReduceAlgo::Auto`) of the `count` elements at
/// device address `p` on `stream`; panics if the call is refused.
///
/// # Safety
/// The buffer at `p` holds `count` f32 and stays alive until the stream has run the call.
pub unsafe fn sum_in_place(c: &Collectives, stream: &CudaStream, p: u64, count: usize) {
    // SAFETY: caller contract.
    unsafe {
        c.all_reduce(
            &RawBuffer::device(p, count, DataType::F32),
            &mut RawBuffer::device(p, count, DataType::F32),
            ReduceOp::Sum,
            stream,
        )
    }
    .unwrap();
}

/// Captures ten in-place f32 sum all-reduces of the `count` elements at device address `p`
/// into a CUDA graph on `stream` and launches the graph three times (the caller
/// synchronises and checks).
pub fn replay_in_place_sums(c: &Collectives, stream: &Arc<CudaStream>, p: u64, count: usize) {
    stream
        .begin_capture(
            cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
        .unwrap();
    for _ in 0..10 {
        // SAFETY: the caller keeps the buffer at p alive until it synchronises.
        unsafe { sum_in_place(c, stream, p, count) };
    }
    let graph = stream
        .end_capture(
            cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH,
        )
        .unwrap()
        .expect("a graph was captured");
    for _ in 0..3 {
        graph.launch().unwrap();
    }
}

/// Nanoseconds since the Unix epoch (comparable between the processes of one machine).
pub fn epoch_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// SIGKILLs this process, as a crash would (no destructor runs, no goodbye is sent), and
/// never returns.
pub fn kill_self() -> ! {
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status();
    std::thread::sleep(Duration::from_secs(60));
    unreachable!("process {pid} was not killed");
}
