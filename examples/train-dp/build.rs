//! Compiles `kernels/` (a no_std crate of ours) to PTX and writes `OUT_DIR/kernels_ptx.rs`.
fn main() {
    let artifacts = mscclpp_device_builder::DeviceBuilder::new("kernels")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    artifacts
        .write_rust_module("kernels_ptx.rs")
        .unwrap_or_else(|e| panic!("{e}"));
}
