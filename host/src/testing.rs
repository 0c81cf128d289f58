//! Support for tests that need a GPU (ours and users').

use crate::cuda::{CudaError, Gpu};

/// Environment variable that turns "no GPU" from a skip into a failure (set it on GPU
/// machines so that a broken driver setup cannot pass as a skip).
pub const REQUIRE_GPU_ENV: &str = "MSCCLPP_REQUIRE_GPU";

/// Whether [`REQUIRE_GPU_ENV`] is `1`.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_ENV).is_ok_and(|v| v == "1")
}

/// Opens GPU `ordinal` for test `test`. Without one, prints why and returns `None` (the
/// test then returns early), or panics when `MSCCLPP_REQUIRE_GPU=1`.
pub fn gpu_or_skip(test: &str, ordinal: usize) -> Option<Gpu> {
    match Gpu::open(ordinal) {
        Ok(g) => Some(g),
        Err(e) => skip_or_fail(test, &e),
    }
}

fn skip_or_fail<T>(test: &str, e: &CudaError) -> Option<T> {
    if gpu_required() {
        panic!("{test}: a GPU is required ({REQUIRE_GPU_ENV}=1) but: {e}");
    }
    eprintln!("skipping {test}: {e} (set {REQUIRE_GPU_ENV}=1 to make this a failure)");
    None
}
