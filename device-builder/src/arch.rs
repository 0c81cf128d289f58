//! PTX arches: the `sm_XX` lists a build is asked for.

use crate::BuildError;

/// Splits `sm_90,sm_80` (spaces allowed); an empty list means `sm_90`.
pub fn parse_arch_list(s: &str) -> Vec<String> {
    let v: Vec<String> = s
        .split([',', ' '])
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .map(String::from)
        .collect();
    if v.is_empty() {
        vec!["sm_90".to_string()]
    } else {
        v
    }
}

/// `sm_90` → 90, `sm_90a` → 90; anything else is a [`BuildError::BadArch`].
pub fn compute_capability(arch: &str) -> Result<u32, BuildError> {
    let digits = arch
        .strip_prefix("sm_")
        .map(|d| d.trim_end_matches(['a', 'f']))
        .filter(|d| !d.is_empty() && d.len() <= 3 && d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| BuildError::BadArch(arch.to_string()))?;
    let cc: u32 = digits
        .parse()
        .map_err(|_| BuildError::BadArch(arch.to_string()))?;
    if cc < 70 {
        // The memory-model instructions (ld.acquire, st.release, fence.acq_rel) need sm_70.
        return Err(BuildError::BadArch(format!(
            "{arch} (sm_70 or newer needed)"
        )));
    }
    Ok(cc)
}
