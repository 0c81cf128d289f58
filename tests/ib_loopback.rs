//! Two processes connected over a real RDMA device (loopback through one adapter, or two
//! ports): proxy channels with `TransportKind::Ib` on the Host backend (host memory), data
//! checked every round. Skips with the reason when the library was built without `ib` or
//! the machine has no RDMA device; fails instead under `MSCCLPP_REQUIRE_IB=1`.
//! Soft-RoCE works too: `rdma link add rxe0 type rxe netdev <if>` and `MSCCLPP_IB_GID_INDEX`
//! set to its IPv4 GID.

use std::time::Duration;

use mscclpp::device::kernels::smoke::probe_value;
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::Launch;
use mscclpp::host::testing::run_test_ranks;
use mscclpp::host::transport::TransportKind;
use mscclpp::host::transport::ib::{REQUIRE_IB_ENV, list_devices};

const ROLE: &str = "MSCCLPP_TEST_ROLE";

/// Why this machine cannot run the test, if it cannot.
fn no_device_reason() -> Option<String> {
    match list_devices() {
        Ok(d) if !d.is_empty() => None,
        Ok(_) => Some("no RDMA device on this machine".into()),
        Err(e) => Some(e.to_string()),
    }
}

fn rank() {
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let config = CommConfig {
        device_timeout: Duration::from_secs(60),
        ..CommConfig::default()
    };
    let mut comm = Communicator::from_bootstrap(bs, Backend::Host, config).unwrap();
    let me = comm.rank();
    let peer = 1 - me;
    let buf = comm.alloc_buffer(1 << 20).unwrap();
    comm.connect(peer, &buf, 0, TransportKind::Ib).unwrap();
    comm.connection_setup().unwrap();
    let conn = comm.device_connections()[0];
    comm.proxy_launch().unwrap();
    let sizes = [8usize, 4096, 1 << 20];
    for round in 1..=200u64 {
        let words = sizes[round as usize % sizes.len()] / 8;
        if (round % 2 == 1) == (me == 0) {
            let v: Vec<u64> = (0..words as u64)
                .map(|i| probe_value(me as u64, round, i))
                .collect();
            buf.write(0, &v).unwrap();
            conn.put_with_signal(0, 0, words as u64 * 8);
            conn.flush();
        } else {
            conn.wait();
            let mut v = vec![0u64; words];
            buf.read(0, &mut v).unwrap();
            for (i, w) in v.iter().enumerate() {
                assert_eq!(
                    *w,
                    probe_value(peer as u64, round, i as u64),
                    "round {round} word {i}"
                );
            }
        }
    }
    comm.bootstrap().barrier().unwrap();
    comm.proxy_stop().unwrap();
    println!("rank {me}: ok");
}

#[test]
fn ib_ping_pong_between_two_processes() {
    if std::env::var(ROLE).is_ok() {
        return rank();
    }
    if let Some(reason) = no_device_reason() {
        if std::env::var(REQUIRE_IB_ENV).is_ok_and(|v| v == "1") {
            panic!("an RDMA device is required ({REQUIRE_IB_ENV}=1) but: {reason}");
        }
        eprintln!(
            "skipping ib_ping_pong_between_two_processes: {reason} (set {REQUIRE_IB_ENV}=1 to make this a failure)"
        );
        return;
    }
    run_test_ranks(
        "ib_ping_pong_between_two_processes",
        2,
        ROLE,
        Duration::from_secs(120),
    );
}
