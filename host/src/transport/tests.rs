use super::host::HostPlane;
use super::*;
use std::sync::atomic::{AtomicU64, Ordering};

/// Connection 0 from `local` to `remote`, its flag `flag` (host memory).
pub(crate) fn route(local: &[u8], remote: &mut [u8], flag: &AtomicU64) -> Route {
    Route {
        id: 0,
        local: local.as_ptr() as u64,
        local_len: local.len() as u64,
        remote: remote.as_mut_ptr() as u64,
        remote_len: remote.len() as u64,
        remote_flag: flag.as_ptr() as u64,
    }
}

#[test]
fn route_check_refuses_anything_leaving_either_buffer() {
    let r = Route {
        id: 0,
        local: 0,
        local_len: 100,
        remote: 0,
        remote_len: 50,
        remote_flag: 0,
    };
    assert!(r.check(0, 0, 50).is_ok());
    assert!(
        r.check(50, 50, 0).is_ok(),
        "zero-size put at the end is legal"
    );
    assert!(r.check(10, 60, 40).is_ok());
    for (d, s, n) in [
        (1, 0, 50),
        (0, 61, 40),
        (u64::MAX, 0, 2),
        (0, u64::MAX - 1, 2),
        (51, 0, 0),
    ] {
        let e = r.check(d, s, n).unwrap_err();
        assert!(
            matches!(e, TransportError::OutOfBounds { .. }),
            "{d} {s} {n}"
        );
    }
}

#[test]
fn host_plane_copies_the_range_then_publishes_the_epoch() {
    let local: Vec<u8> = (0..=255).collect();
    let mut remote = vec![0u8; 128];
    let flag = AtomicU64::new(0);
    let r = route(&local, &mut remote, &flag);
    let mut p = HostPlane;
    p.put(&r, 8, 100, 16).unwrap();
    p.signal(&r, 7).unwrap();
    p.flush().unwrap();
    assert_eq!(flag.load(Ordering::Acquire), 7);
    assert_eq!(&remote[8..24], &local[100..116]);
    assert!(remote[..8].iter().chain(&remote[24..]).all(|b| *b == 0));
    assert!(p.put(&r, 120, 0, 16).is_err());
    assert!(
        remote[120..].iter().all(|b| *b == 0),
        "a refused put writes nothing"
    );
}
