//! The device crate's PTX (docs/guide/06-design.md §3), embedded as `OUT_DIR/device_ptx.rs`:
//! the PTX shipped in `ptx/` when it is up to date with `../device` (always so in a packaged
//! crate, where `../device` is absent), else compiled here with the pinned nightly. Either way
//! ptxas, when found, adds the cubin. `MSCCLPP_DEVICE_BUILD` (auto, shipped, nightly) chooses,
//! and `MSCCLPP_PTX_EXPORT_DIR=<dir>` writes a fresh build there as shipped PTX (what
//! `scripts/update-ptx.sh` does).
use mscclpp_device_builder::{BuildMode, DeviceBuilder};

/// Where a fresh build is written as shipped PTX, when set.
const EXPORT_VAR: &str = "MSCCLPP_PTX_EXPORT_DIR";

fn main() {
    println!("cargo:rerun-if-env-changed={EXPORT_VAR}");
    let export = std::env::var_os(EXPORT_VAR).filter(|d| !d.is_empty());
    let mut builder = DeviceBuilder::new("../device").shipped_ptx("ptx", "scripts/update-ptx.sh");
    if export.is_some() {
        builder = builder.mode(BuildMode::Nightly);
    }
    let artifacts = builder.build().unwrap_or_else(|e| fail(&e));
    artifacts
        .write_rust_module("device_ptx.rs")
        .unwrap_or_else(|e| fail(&e));
    if let Some(dir) = export {
        let dir = std::path::PathBuf::from(dir);
        if !dir.is_absolute() {
            fail(&format!(
                "{EXPORT_VAR} must be an absolute path, not {}",
                dir.display()
            ));
        }
        artifacts.write_shipped(&dir).unwrap_or_else(|e| fail(&e));
        // A removed or edited export is written again by the next build.
        println!("cargo:rerun-if-changed={}", dir.display());
    }
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(1)
}
