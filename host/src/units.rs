//! Byte counts as people write and read them: [`parse_size`] reads `64K` or `16M` (the perf
//! tool's `-b`/`-e`, test settings), [`bytes_text`] writes `64.0 MiB` (error messages).

/// Parses a byte count the way nccl-tests does: a number with an optional suffix `K`, `M`,
/// `G` or `T` (powers of 1024; `KB`, `KiB` and a trailing `B` are accepted too). Fractions are
/// allowed when the result is a whole number of bytes (`1.5K`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    match crate::settings::parse_bytes(text)? {
        0 => Err(format!("{text:?}: sizes must be at least 1 byte")),
        bytes => Ok(bytes),
    }
}

/// `bytes` in binary units, one decimal (`64.0 MiB`).
pub fn bytes_text(bytes: u128) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let (mut value, mut unit) = (bytes as f64, 0);
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}
