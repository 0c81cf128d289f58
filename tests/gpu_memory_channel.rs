//! Memory channels over P2P between two processes, one GPU each (both on GPU 0 when the
//! machine has one): put/get of random data at odd sizes and alignments, LL packets over
//! many rounds with a reused scratch, and the signal/wait round trip. Every received word is
//! checked by the receiving kernel. Skips with a reason without a GPU; fails instead under
//! MSCCLPP_REQUIRE_GPU=1.

use std::time::Duration;

use mscclpp::host::communicator::{Backend, CommConfig, Communicator, MemoryChannelArg};
use mscclpp::host::cuda::{DeviceBuffer, Gpu, KernelModule, LaunchConfig, PushKernelArg};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::{gpu_or_skip, run_test_ranks};
use mscclpp::host::transport::TransportKind;

const ROLE: &str = "MSCCLPP_TEST_ROLE";
const BYTES: usize = (4 << 20) + 64;

fn run_two(test: &str) {
    if gpu_or_skip(test, 0).is_none() {
        return;
    }
    run_test_ranks(test, 2, ROLE, Duration::from_secs(180));
}

struct Rank {
    comm: Communicator,
    gpu: Gpu,
    module: KernelModule,
    errors: DeviceBuffer,
}

impl Rank {
    /// The channel's handle (it borrows the communicator, so it is made when needed
    /// rather than kept next to it).
    fn ch(&self) -> MemoryChannelArg<'_> {
        MemoryChannelArg(self.comm.memory_channels()[0])
    }
}

fn rank_setup() -> Rank {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let backend = Backend::auto(bs.local_rank()).unwrap();
    let Backend::Gpu(gpu) = backend.clone() else {
        panic!("rank {} found no GPU", bs.rank())
    };
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    let mut comm = Communicator::from_bootstrap(bs, backend, config).unwrap();
    let buf = comm.alloc_buffer(BYTES).unwrap();
    let peer = 1 - comm.rank();
    comm.connect_memory(peer, &buf, 0, TransportKind::P2p, 1 << 20)
        .unwrap();
    comm.connection_setup().unwrap();
    let module = KernelModule::load_builtin(&gpu).unwrap();
    let errors = DeviceBuffer::zeroed(&gpu, 8).unwrap();
    Rank {
        comm,
        gpu,
        module,
        errors,
    }
}

fn block(threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn finish(r: Rank) {
    let mut bad = [0u64];
    r.errors.copy_to_host(0, &mut bad).unwrap();
    let me = r.comm.rank();
    assert_eq!(bad[0], 0, "rank {me}: {} wrong words received", bad[0]);
    r.comm.bootstrap().barrier().unwrap();
    println!("rank {me}: ok");
}

fn put_get_rank() {
    let r = rank_setup();
    let f = r.module.function("memory_ping_pong").unwrap();
    let g = r.module.function("memory_get_ping_pong").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let (rank, perr) = (r.comm.rank() as u32, r.errors.device_ptr());
    for (i, (bytes, src, dst)) in [
        (1u64, 0u64, 0u64),
        (17, 3, 5),
        (4093, 1, 14),
        (65_536, 16, 32),
        ((1 << 20) + 7, 9, 2),
        (4 << 20, 0, 64),
    ]
    .into_iter()
    .enumerate()
    {
        let (rounds, seed) = (40u64, 100 + i as u64);
        let ch = r.ch();
        let mut l = stream.launch_builder(&f);
        l.arg(&ch)
            .arg(&bytes)
            .arg(&rounds)
            .arg(&rank)
            .arg(&seed)
            .arg(&src)
            .arg(&dst)
            .arg(&perr);
        // SAFETY: the channel's memory lives in `r.comm`; offsets + sizes fit BYTES.
        unsafe { l.launch(block(1024)) }.unwrap();
        stream.synchronize().unwrap();
        let ch = r.ch();
        let mut l = stream.launch_builder(&g);
        l.arg(&ch)
            .arg(&bytes)
            .arg(&rounds)
            .arg(&rank)
            .arg(&seed)
            .arg(&src)
            .arg(&dst)
            .arg(&perr);
        // SAFETY: as above.
        unsafe { l.launch(block(1024)) }.unwrap();
        stream.synchronize().unwrap();
    }
    finish(r);
}

fn packets_rank() {
    let r = rank_setup();
    let f = r.module.function("memory_packet_ping_pong").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let (rank, perr) = (r.comm.rank() as u32, r.errors.device_ptr());
    for (i, bytes) in [8u64, 4000, 1 << 16].into_iter().enumerate() {
        let (rounds, seed) = (500u64, 7 + i as u64);
        let ch = r.ch();
        let mut l = stream.launch_builder(&f);
        l.arg(&ch)
            .arg(&bytes)
            .arg(&rounds)
            .arg(&rank)
            .arg(&seed)
            .arg(&perr);
        // SAFETY: as above; the packets of 64 KiB of data fit the 1 MiB scratch.
        unsafe { l.launch(block(1024)) }.unwrap();
        stream.synchronize().unwrap();
    }
    finish(r);
}

fn signal_rank() {
    let r = rank_setup();
    let f = r.module.function("memory_signal_ping_pong").unwrap();
    let stream = r.gpu.new_stream().unwrap();
    let (rounds, rank) = (20_000u64, r.comm.rank() as u32);
    let ch = r.ch();
    let mut l = stream.launch_builder(&f);
    l.arg(&ch).arg(&rounds).arg(&rank);
    // SAFETY: as above.
    unsafe { l.launch(block(1)) }.unwrap();
    stream.synchronize().unwrap();
    finish(r);
}

#[test]
fn memory_put_get_odd_sizes_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return put_get_rank();
    }
    run_two("memory_put_get_odd_sizes_two_processes");
}

#[test]
fn memory_packets_many_rounds_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return packets_rank();
    }
    run_two("memory_packets_many_rounds_two_processes");
}

#[test]
fn memory_signal_wait_round_trips_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return signal_rank();
    }
    run_two("memory_signal_wait_round_trips_two_processes");
}
