//! PTX shipped in a crate's sources, with a stamp of what it was built from.
//!
//! A crate that ships its kernels' PTX (`host/ptx/` in this project) builds on a stable
//! toolchain and from a packaged crate, where neither the pinned nightly nor the kernel
//! crate's directory is at hand. The directory holds one `<crate>.<arch>.ptx` per arch
//! and a [`STAMP_FILE`] naming the toolchain, a hash of everything the nested build reads
//! that this crate can see (the kernel crate's `Cargo.toml` and `src/`, the build
//! settings and the PTX linker's source), and a hash of each PTX file.
//!
//! The hashes are FNV-1a (128 bits): they tell an edited source from an unchanged one, they
//! are not meant to resist a forger. What the hash cannot see (the workspace's own manifest
//! and lock file, rustc's behaviour) is covered by rebuilding and comparing byte for byte
//! (this project's CI does, with `MSCCLPP_DEVICE_BUILD=nightly`).

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use crate::BuildError;

/// The stamp's file name inside a shipped-PTX directory.
pub const STAMP_FILE: &str = "stamp.txt";

/// Where a build's PTX came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PtxOrigin {
    /// Compiled from the kernel crate's sources by the nested nightly build.
    Built,
    /// Taken from the shipped-PTX directory.
    Shipped,
}

/// Which PTX [`crate::DeviceBuilder::build`] may use: `MSCCLPP_DEVICE_BUILD`, read once per
/// build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BuildMode {
    /// `auto` (the default): the shipped PTX when it is up to date with the kernel crate's
    /// sources (or those are not here, as in a packaged crate), else a nightly build, with a
    /// `cargo:warning` when shipped PTX was passed over as stale.
    #[default]
    Auto,
    /// `shipped`: never run the nested nightly build; a missing or stale shipped PTX is an
    /// error. CI sets it to prove that a build needed no nightly.
    Shipped,
    /// `nightly`: always build from the kernel crate's sources with a nightly, even when
    /// the shipped PTX is up to date (to refresh it, or to compare with it).
    Nightly,
}

impl BuildMode {
    /// The environment variable that selects the mode.
    pub const ENV: &'static str = "MSCCLPP_DEVICE_BUILD";

    /// Parses `auto`, `shipped` or `nightly` (an empty value is `auto`).
    pub fn parse(value: &str) -> Result<BuildMode, BuildError> {
        match value.trim() {
            "" | "auto" => Ok(BuildMode::Auto),
            "shipped" => Ok(BuildMode::Shipped),
            "nightly" => Ok(BuildMode::Nightly),
            other => Err(BuildError::BadSetting {
                var: BuildMode::ENV,
                value: other.to_string(),
                expected: "auto, shipped or nightly",
            }),
        }
    }

    /// The mode `MSCCLPP_DEVICE_BUILD` selects (`auto` when unset).
    pub fn from_env() -> Result<BuildMode, BuildError> {
        match std::env::var(BuildMode::ENV) {
            Ok(v) => BuildMode::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(BuildMode::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(BuildError::BadSetting {
                var: BuildMode::ENV,
                value: v.to_string_lossy().into_owned(),
                expected: "auto, shipped or nightly",
            }),
        }
    }
}

/// 128-bit FNV-1a over a sequence of byte strings (each prefixed with its length, so that
/// `["ab", "c"]` and `["a", "bc"]` differ).
#[derive(Debug, Clone)]
pub(crate) struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013b;

    pub(crate) fn new() -> Self {
        Fnv128(Self::OFFSET)
    }

    fn bytes(&mut self, data: &[u8]) {
        for &b in data {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// Plain FNV-1a of `data` (no length prefix), to compare with published vectors.
    #[cfg(test)]
    pub(crate) fn bytes_for_test(&mut self, data: &[u8]) {
        self.bytes(data);
    }

    /// Adds one field: its length, then its bytes.
    pub(crate) fn field(&mut self, data: &[u8]) -> &mut Self {
        self.bytes(&(data.len() as u64).to_le_bytes());
        self.bytes(data);
        self
    }

    pub(crate) fn hex(&self) -> String {
        format!("fnv1a128:{:032x}", self.0)
    }
}

/// The hash of one file's bytes, as written in the stamp.
pub(crate) fn file_hash(path: &Path) -> Result<String, BuildError> {
    let data = fs::read(path).map_err(|error| BuildError::Io {
        path: path.to_path_buf(),
        error,
    })?;
    Ok(Fnv128::new().field(&data).hex())
}

/// Every file the inputs hash reads from the kernel crate: `Cargo.toml`, and each file
/// under `src/` (any extension: `include_str!` may read them), as (path relative to the
/// crate with `/` separators, absolute path), sorted.
pub(crate) fn kernel_crate_files(crate_dir: &Path) -> Result<Vec<(String, PathBuf)>, BuildError> {
    let mut files = vec![("Cargo.toml".to_string(), crate_dir.join("Cargo.toml"))];
    let mut dirs = vec![(String::from("src"), crate_dir.join("src"))];
    while let Some((rel, dir)) = dirs.pop() {
        let entries = fs::read_dir(&dir).map_err(|error| BuildError::Io {
            path: dir.clone(),
            error,
        })?;
        for entry in entries {
            let entry = entry.map_err(|error| BuildError::Io {
                path: dir.clone(),
                error,
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            let rel = format!("{rel}/{name}");
            if path.is_dir() {
                dirs.push((rel, path));
            } else {
                files.push((rel, path));
            }
        }
    }
    files.sort();
    Ok(files)
}

/// The hash of what a nested build of `crate_dir` reads that is visible from here: the
/// toolchain's name, the build's fixed settings (`recipe`), the cargo features, and the
/// kernel crate's files.
pub(crate) fn inputs_hash(
    crate_dir: &Path,
    toolchain: &str,
    recipe: &str,
    features: &[String],
) -> Result<String, BuildError> {
    let mut h = Fnv128::new();
    h.field(toolchain.as_bytes()).field(recipe.as_bytes());
    for f in features {
        h.field(f.as_bytes());
    }
    for (rel, path) in kernel_crate_files(crate_dir)? {
        let data = fs::read(&path).map_err(|error| BuildError::Io {
            path: path.clone(),
            error,
        })?;
        h.field(rel.as_bytes()).field(&data);
    }
    Ok(h.hex())
}

/// One PTX file named in a stamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StampedPtx {
    pub(crate) arch: String,
    pub(crate) file: String,
    pub(crate) hash: String,
}

/// The parsed [`STAMP_FILE`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stamp {
    /// The toolchain the PTX was built with, as rustup names it (`nightly-2026-05-19`).
    pub(crate) toolchain: String,
    /// `rustc -V` of that toolchain (for people; not compared).
    pub(crate) rustc: String,
    /// [`inputs_hash`] at the time of the build.
    pub(crate) inputs: String,
    pub(crate) ptx: Vec<StampedPtx>,
}

impl Stamp {
    pub(crate) fn to_text(&self) -> String {
        let mut s = String::from(
            "# The shipped PTX beside this file and what it was built from. Written by the\n\
             # device build (mscclpp-device-builder, write_shipped); do not edit by hand.\n",
        );
        let _ = writeln!(s, "toolchain {}", self.toolchain);
        let _ = writeln!(s, "rustc {}", self.rustc);
        let _ = writeln!(s, "inputs {}", self.inputs);
        for p in &self.ptx {
            let _ = writeln!(s, "ptx {} {} {}", p.arch, p.file, p.hash);
        }
        s
    }

    pub(crate) fn parse(text: &str, path: &Path) -> Result<Stamp, BuildError> {
        let bad = |line: &str, why: &str| BuildError::BadStamp {
            path: path.to_path_buf(),
            detail: format!("{why}: `{line}`"),
        };
        let (mut toolchain, mut rustc, mut inputs) = (None, None, None);
        let mut ptx = Vec::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (key, rest) = line.split_once(' ').ok_or_else(|| bad(line, "no value"))?;
            match key {
                "toolchain" => toolchain = Some(rest.trim().to_string()),
                "rustc" => rustc = Some(rest.trim().to_string()),
                "inputs" => inputs = Some(rest.trim().to_string()),
                "ptx" => {
                    let f: Vec<&str> = rest.split_whitespace().collect();
                    let [arch, file, hash] = f[..] else {
                        return Err(bad(line, "expected `ptx ARCH FILE HASH`"));
                    };
                    if file.contains('/') || file.contains('\\') {
                        return Err(bad(line, "the PTX file must be a bare file name"));
                    }
                    ptx.push(StampedPtx {
                        arch: arch.to_string(),
                        file: file.to_string(),
                        hash: hash.to_string(),
                    });
                }
                _ => return Err(bad(line, "unknown key")),
            }
        }
        let missing = |k: &str| BuildError::BadStamp {
            path: path.to_path_buf(),
            detail: format!("no `{k}` line"),
        };
        Ok(Stamp {
            toolchain: toolchain.ok_or_else(|| missing("toolchain"))?,
            rustc: rustc.ok_or_else(|| missing("rustc"))?,
            inputs: inputs.ok_or_else(|| missing("inputs"))?,
            ptx,
        })
    }

    pub(crate) fn read(dir: &Path) -> Result<Stamp, BuildError> {
        let path = dir.join(STAMP_FILE);
        let text = fs::read_to_string(&path).map_err(|error| BuildError::Io {
            path: path.clone(),
            error,
        })?;
        Stamp::parse(&text, &path)
    }
}
