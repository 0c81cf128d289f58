//! Compiles the device crate to PTX (docs/guide/06-design.md §3) and embeds it as
//! `OUT_DIR/device_ptx.rs`.
fn main() {
    let artifacts = mscclpp_device_builder::DeviceBuilder::new("../device")
        .build()
        .unwrap_or_else(|e| {
            eprintln!("error: {e}");
            std::process::exit(1)
        });
    artifacts
        .write_rust_module("device_ptx.rs")
        .unwrap_or_else(|e| panic!("{e}"));
}
