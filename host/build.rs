//! The device crate's PTX (docs/guide/06-design.md §3), embedded as `OUT_DIR/device_ptx.rs`:
//! the PTX shipped in `ptx/` when it is up to date with `../device` (always so in a packaged
//! crate, where `../device` is absent), else compiled here with the pinned nightly. Either way
//! ptxas, when found, adds the cubin. `MSCCLPP_DEVICE_BUILD` (auto, shipped, nightly) chooses,
//! and `MSCCLPP_PTX_EXPORT_DIR=<dir>` writes a fresh build there as shipped PTX (what
//! `scripts/update-ptx.sh` does).
//!
//! With feature `testing` the device crate is compiled with its `test-kernels` feature, always
//! with the nightly: the shipped PTX has no test kernels, and a PTX with them is never shipped.
use mscclpp_device_builder::{BuildMode, DeviceBuilder};

/// Where a fresh build is written as shipped PTX, when set.
const EXPORT_VAR: &str = "MSCCLPP_PTX_EXPORT_DIR";

/// The device crate's feature that adds its test kernels.
const TEST_KERNELS: &str = "test-kernels";

fn main() {
    println!("cargo:rerun-if-env-changed={EXPORT_VAR}");
    let export = std::env::var_os(EXPORT_VAR).filter(|d| !d.is_empty());
    let testing = std::env::var_os("CARGO_FEATURE_TESTING").is_some();
    let builder = if testing {
        testing_builder(export.is_some())
    } else {
        let builder = DeviceBuilder::new("../device").shipped_ptx("ptx", "scripts/update-ptx.sh");
        if export.is_some() {
            builder.mode(BuildMode::Nightly)
        } else {
            builder
        }
    };
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

/// The build of feature `testing`: the device crate with its test kernels, from its sources.
fn testing_builder(export: bool) -> DeviceBuilder {
    if export {
        fail(&format!(
            "{EXPORT_VAR} is set in a build with feature `testing`: the shipped PTX must not \
             hold the test kernels; export from a build without it (scripts/update-ptx.sh)"
        ));
    }
    match BuildMode::from_env() {
        Ok(BuildMode::Shipped) => fail(&format!(
            "{}=shipped, but feature `testing` needs the device crate's test kernels, which \
             no shipped PTX has: unset it to let this build compile them with the pinned \
             nightly, or build without the feature",
            BuildMode::ENV
        )),
        Ok(_) => {}
        Err(e) => fail(&e),
    }
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default();
    if !std::path::Path::new(&manifest_dir)
        .join("../device/Cargo.toml")
        .is_file()
    {
        fail(
            &"feature `testing` compiles the test kernels from the device crate's sources, \
              which a packaged mscclpp-host lacks: build it from the repository",
        );
    }
    DeviceBuilder::new("../device")
        .feature(TEST_KERNELS)
        .mode(BuildMode::Nightly)
}

fn fail(e: &dyn std::fmt::Display) -> ! {
    eprintln!("error: {e}");
    std::process::exit(1)
}
