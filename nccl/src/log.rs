//! `MSCCLPP_DEBUG` output on stderr: `WARN` prints failures, `INFO` also the setup of each
//! communicator and, once per (call, data type, operation, path), which path served a call.
//! Each line is written whole ([`eprint_line`]): the ranks of a job usually share stderr.

use std::collections::HashSet;
use std::sync::Mutex;

use mscclpp_host::diag::eprint_line;
use mscclpp_host::settings::Settings;

/// How much is printed (`MSCCLPP_DEBUG`, [`Settings::debug`]).
pub use mscclpp_host::settings::DebugLevel as Level;

/// The level of `MSCCLPP_DEBUG` (read once, with the other settings).
pub fn level() -> Level {
    Settings::global_or_default().debug
}

/// Prints a failure under `WARN` or more.
pub fn warn(msg: &str) {
    if level() >= Level::Warn {
        eprint_line(&format!(
            "[mscclpp-nccl pid {}] WARN {msg}",
            std::process::id()
        ));
    }
}

/// Prints under `INFO`.
pub fn info(msg: &str) {
    if level() >= Level::Info {
        eprint_line(&format!(
            "[mscclpp-nccl pid {}] INFO {msg}",
            std::process::id()
        ));
    }
}

/// Which path served a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// Our kernels.
    Native,
    /// The real NCCL, on the real communicator beside ours.
    Fallback,
    /// A communicator this library did not create (the real NCCL's own, e.g. when it calls
    /// its public API internally and LD_PRELOAD sends that call here): passed on unchanged.
    PassThrough,
}

impl Path {
    /// The word printed.
    pub fn name(self) -> &'static str {
        match self {
            Path::Native => "native (mscclpp)",
            Path::Fallback => "fallback (real NCCL)",
            Path::PassThrough => "pass-through (real NCCL communicator)",
        }
    }
}

/// Under `INFO`, prints `rank r/n: call dtype op -> path` the first time this combination
/// is seen in the process.
pub fn call_path(call: &str, rank: usize, nranks: usize, dtype: &str, op: &str, path: Path) {
    if level() < Level::Info {
        return;
    }
    // Per thread, keyed by the strings' addresses and lengths (the names are static): the
    // common case, a call site already printed, costs a hash lookup and no allocation.
    thread_local! {
        static PRINTED: std::cell::RefCell<HashSet<[usize; 7]>> =
            std::cell::RefCell::new(HashSet::new());
    }
    let fast = [
        call.as_ptr() as usize,
        call.len(),
        dtype.as_ptr() as usize,
        dtype.len(),
        op.as_ptr() as usize,
        op.len(),
        path as usize,
    ];
    if !PRINTED.with(|p| p.borrow_mut().insert(fast)) {
        return;
    }
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let key = format!("{call} {dtype} {op} -> {}", path.name());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    if seen.get_or_insert_with(HashSet::new).insert(key.clone()) {
        info(&format!("rank {rank}/{nranks}: {key}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        let read = |v: &str| Settings::from_vars([("MSCCLPP_DEBUG", v)]).map(|s| s.debug);
        assert_eq!(read("info"), Ok(Level::Info));
        assert_eq!(read("WARN"), Ok(Level::Warn));
        assert_eq!(read(""), Ok(Level::None));
        assert!(
            read("what")
                .unwrap_err()
                .to_string()
                .contains("MSCCLPP_DEBUG=\"what\"")
        );
        assert!(Level::Info > Level::Warn);
    }
}
