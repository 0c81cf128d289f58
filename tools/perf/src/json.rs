//! `--json FILE`: the run's metadata and every row, for both libraries.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::PerfError;
use super::report::Row;

/// Everything `--json` writes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// `mscclpp-perf`.
    pub tool: String,
    /// The crate version.
    pub version: String,
    /// The command line, program included, as [`public_command_line`] writes it: the
    /// program's file name, not its path, and output files without their folder.
    pub command_line: Vec<String>,
    /// UTC, ISO 8601 (`2026-11-29T12:00:00Z`).
    pub date: String,
    /// `--op`: `allreduce`, `allgather`, `reducescatter`, `broadcast`, `reduce`, `alltoall`
    /// or `sendrecv`.
    pub collective: String,
    /// Data type name.
    pub dtype: String,
    /// Reduction name (`none` for the collectives that only move bytes).
    pub redop: String,
    /// `--algo`.
    pub algo: String,
    /// Number of ranks.
    pub nranks: usize,
    /// `gpu` or `host` (Host transport, CPU threads).
    pub backend: String,
    /// One entry per rank: its GPU's name and PCI bus id, or `host`.
    pub devices: Vec<String>,
    /// Host name of each rank.
    pub hosts: Vec<String>,
    /// NCCL's version (e.g. `2.27.3`) with `--compare nccl`.
    pub nccl_version: Option<String>,
    /// Timed iterations per size.
    pub iters: u32,
    /// Warm-up iterations per size.
    pub warmup_iters: u32,
    /// CUDA graph launches (0: plain launches).
    pub graph_launches: u32,
    /// Whether results were checked.
    pub check: bool,
    /// The table.
    pub rows: Vec<Row>,
}

impl Report {
    /// As pretty JSON.
    pub fn to_json(&self) -> String {
        // A struct of strings, numbers and options always serialises.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Parses what [`to_json`](Self::to_json) wrote.
    pub fn from_json(text: &str) -> Result<Report, PerfError> {
        serde_json::from_str(text).map_err(|e| PerfError::Json(e.to_string()))
    }

    /// Writes the JSON to `path`.
    pub fn write(&self, path: &Path) -> Result<(), PerfError> {
        std::fs::write(path, self.to_json() + "\n").map_err(|e| PerfError::Io {
            what: format!("cannot write {}", path.display()),
            source: e,
        })
    }
}

/// The flags whose value is an output file (`--dump-params`: the training example's).
const OUTPUT_FLAGS: [&str; 3] = ["--json", "--plot", "--dump-params"];

/// Checks before a run that each output file (`(flag, path)`, `None` where the flag was not
/// given) can be written: not a folder, in a folder that exists and takes a new file, and no
/// two flags naming the same file (the second written would replace the first). The files
/// are written after the run, which may be long: a path that fails then loses its results.
/// A file that exists is opened for appending and left as it was; for one that does not, a
/// file of this process's own name beside it is created and removed. Called once, by the
/// process that writes the files (rank 0, or the launcher before it starts the ranks).
pub fn check_outputs(outputs: &[(&str, Option<&Path>)]) -> Result<(), String> {
    let mut seen: Vec<(&str, PathBuf)> = Vec::new();
    for (flag, path) in outputs.iter().filter_map(|&(f, p)| Some((f, p?))) {
        let full = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        let same = std::fs::canonicalize(path).unwrap_or_else(|_| full.clone());
        if let Some((other, _)) = seen.iter().find(|(_, p)| *p == same || *p == full) {
            return Err(format!(
                "{other} and {flag} both name {}: the second written would replace the first",
                path.display()
            ));
        }
        if path.is_dir() {
            return Err(format!(
                "{flag} {}: is a folder, not a file",
                path.display()
            ));
        }
        let probe = if path.exists() {
            std::fs::OpenOptions::new()
                .append(true)
                .open(path)
                .map(|_| ())
        } else {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            let beside = path.with_file_name(format!(
                ".{}.probe-{}",
                name.unwrap_or_default(),
                std::process::id()
            ));
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&beside)
                .map(|_| {
                    let _ = std::fs::remove_file(&beside);
                })
        };
        if let Err(e) = probe {
            return Err(format!("{flag} {}: cannot write it: {e}", path.display()));
        }
        seen.push((flag, same));
    }
    Ok(())
}

/// `args` (program first) as a report shows it: the program by its file name only, and the
/// output files (`--json`, `--plot`, `--dump-params`) by theirs (`--json /runs/a/out.json`
/// becomes `--json out.json`),
/// so a report says what ran without naming folders of the machine that ran it.
pub fn public_command_line<S: AsRef<str>>(args: &[S]) -> Vec<String> {
    let file_name = |a: &str| {
        Path::new(a)
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| a.to_string())
    };
    let mut out = Vec::with_capacity(args.len());
    let mut value_of_output = false;
    for (i, a) in args.iter().map(AsRef::as_ref).enumerate() {
        let shown = if i == 0 || value_of_output {
            file_name(a)
        } else if let Some((flag, value)) = a.split_once('=')
            && OUTPUT_FLAGS.contains(&flag)
        {
            format!("{flag}={}", file_name(value))
        } else {
            a.to_string()
        };
        value_of_output = i > 0 && !value_of_output && OUTPUT_FLAGS.contains(&a);
        out.push(shown);
    }
    out
}

/// `secs` since the Unix epoch as an ISO 8601 UTC date (no time-zone database needed).
pub fn iso8601_utc(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Now, as [`iso8601_utc`].
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    iso8601_utc(secs)
}
