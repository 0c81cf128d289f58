//! What the GPU tests of the C API share: the GPU count, and an `ncclUniqueId` made by the
//! parent and handed to the rank processes as hex in an environment variable.

#![allow(dead_code)]

use mscclpp_nccl::api::ncclGetUniqueId;
use mscclpp_nccl::system_nccl::RawUniqueId;

/// The environment variable with a rank process's rank.
pub const RANK_ENV: &str = "MSCCLPP_NCCL_TEST_RANK";
/// The environment variable with the unique id (hex).
pub const ID_ENV: &str = "MSCCLPP_NCCL_TEST_ID";

/// GPUs visible (0 without a driver).
pub fn gpu_count() -> usize {
    mscclpp_host::cuda::device_count().unwrap_or(0)
}

/// A fresh unique id from the library, as hex.
pub fn new_id_hex() -> String {
    let mut id = RawUniqueId { internal: [0; 128] };
    // SAFETY: a live out-parameter.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, 0);
    id.internal
        .iter()
        .map(|b| format!("{:02x}", *b as u8))
        .collect()
}

/// The unique id of [`ID_ENV`] (set by the parent).
pub fn id_from_env() -> RawUniqueId {
    let hex = std::env::var(ID_ENV).unwrap();
    let mut id = RawUniqueId { internal: [0; 128] };
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap() as _;
    }
    id
}

/// Waits for every child, killing them all and failing after `limit`; returns their exit
/// codes in order (`None`: ended by a signal).
pub fn wait_all(
    children: &mut [std::process::Child],
    limit: std::time::Duration,
    what: &str,
) -> Vec<Option<i32>> {
    let start = std::time::Instant::now();
    let mut codes: Vec<Option<Option<i32>>> = vec![None; children.len()];
    while codes.iter().any(Option::is_none) {
        for (i, c) in children.iter_mut().enumerate() {
            if codes[i].is_none()
                && let Some(s) = c.try_wait().unwrap()
            {
                codes[i] = Some(s.code());
            }
        }
        if start.elapsed() > limit {
            for c in children.iter_mut() {
                let _ = c.kill();
            }
            panic!("{what}: ranks hung: {codes:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    codes.into_iter().flatten().collect()
}
