//! Byte counts as people write and read them: [`parse_size`] reads `64K` or `16M` (the perf
//! tool's `-b`/`-e`, test settings), [`bytes_text`] writes `64.0 MiB` (error messages).

/// Parses a byte count the way nccl-tests does: a number with an optional suffix `K`, `M`,
/// `G` or `T` (powers of 1024; `KB`, `KiB` and a trailing `B` are accepted too). Fractions are
/// allowed when the result is a whole number of bytes (`1.5K`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits_end);
    if number.is_empty() {
        return Err(format!(
            "{text:?} is not a size (expected e.g. 8, 64K, 32M, 1G)"
        ));
    }
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => {
            return Err(format!(
                "{text:?}: unknown size suffix {:?} (use K, M, G or T)",
                suffix.trim()
            ));
        }
    };
    let unit = 1u64 << shift;
    let bytes = if let Some((whole, frac)) = number.split_once('.') {
        if frac.contains('.') || (whole.is_empty() && frac.is_empty()) {
            return Err(format!("{text:?} is not a size"));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{text:?} is not a size"))?;
        let bytes = value * unit as f64;
        if !(bytes.is_finite() && bytes < u64::MAX as f64) || bytes.fract() != 0.0 {
            return Err(format!("{text:?} is not a whole number of bytes"));
        }
        bytes as u64
    } else {
        number
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .ok_or_else(|| format!("{text:?} is too large"))?
    };
    if bytes == 0 {
        return Err(format!("{text:?}: sizes must be at least 1 byte"));
    }
    Ok(bytes)
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
