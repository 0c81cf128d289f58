//! The nested build: `cargo rustc` of the kernel crate for nvptx with our profile and the PTX
//! linker, and the fixed settings (the recipe) that a shipped PTX's stamp hashes.

use std::fs;
use std::path::{Path, PathBuf};

use crate::toolchain::Toolchain;
use crate::{BuildError, NVPTX_TARGET};

pub(crate) const LINKER_SOURCE: &str = include_str!("linker.rs");

/// The release profile of the nested build (`--config profile.release.KEY=VALUE`).
const PROFILE: &[(&str, &str)] = &[
    ("panic", "\"abort\""),
    ("lto", "\"fat\""),
    ("codegen-units", "1"),
    ("opt-level", "3"),
    ("debug", "false"),
    ("incremental", "false"),
    ("overflow-checks", "false"),
];

/// The nested build's fixed settings, as hashed into a shipped PTX's stamp: a change here
/// makes every shipped PTX stale.
pub(crate) fn recipe() -> String {
    format!(
        "target {NVPTX_TARGET}\nbuild-std core\nprofile {PROFILE:?}\n\
         rustflags -Ctarget-cpu=ARCH -Clinker=LINKER\nlinker\n{LINKER_SOURCE}"
    )
}

/// What one nested build left: its PTX and the sources it read.
pub(crate) struct Built {
    pub(crate) ptx: PathBuf,
    pub(crate) sources: Vec<PathBuf>,
}

/// Builds the kernel crate of `manifest` for `arch` with `tc` into `target_dir` and finds
/// the PTX it wrote, with the sources its dep-info lists.
pub(crate) fn cargo_build(
    tc: &Toolchain,
    manifest: &Path,
    target_dir: &Path,
    arch: &str,
    linker: &Path,
    features: &[String],
) -> Result<Built, BuildError> {
    let mut cmd = tc.command("cargo");
    cmd.arg("rustc")
        .arg("--manifest-path")
        .arg(manifest)
        .args(["--lib", "--crate-type", "cdylib", "--release"])
        .args(["--target", NVPTX_TARGET, "-Zbuild-std=core"])
        .arg("--target-dir")
        .arg(target_dir);
    for (k, v) in PROFILE {
        cmd.arg("--config").arg(format!("profile.release.{k}={v}"));
    }
    if !features.is_empty() {
        cmd.arg("--features").arg(features.join(","));
    }
    // target-cpu in RUSTFLAGS reaches core too: LLVM only inlines across functions with
    // the same target-cpu, so core and the kernels must agree.
    let flags = [
        format!("-Ctarget-cpu={arch}"),
        format!("-Clinker={}", linker.display()),
    ];
    cmd.env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"));
    cmd.env("MSCCLPP_LLVM_TOOLS_DIR", &tc.llvm_tools);
    if let Some(dir) = manifest.parent() {
        cmd.current_dir(dir);
    }
    let what = format!(
        "building device crate {} for {arch} with {}",
        manifest.display(),
        tc.name
    );
    // The cdylib lands as `<lib name>.ptx` in the target's release directory; PTX of an
    // earlier build there (a renamed crate) must not pass for this one's.
    let artifact_dir = target_dir.join(NVPTX_TARGET).join("release");
    let ptx_files = |dir: &Path| -> Vec<PathBuf> {
        fs::read_dir(dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
                    .collect()
            })
            .unwrap_or_default()
    };
    for old in ptx_files(&artifact_dir) {
        fs::remove_file(&old).map_err(|error| BuildError::Io { path: old, error })?;
    }
    let out = cmd.output().map_err(|e| BuildError::Command {
        what: what.clone(),
        output: format!("cannot run cargo: {e}"),
    })?;
    if !out.status.success() {
        return Err(BuildError::Command {
            what,
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    let ptx = match &ptx_files(&artifact_dir)[..] {
        [one] => one.clone(),
        found => {
            return Err(BuildError::Command {
                what,
                output: format!(
                    "expected one .ptx in {} after the build, found {found:?}",
                    artifact_dir.display()
                ),
            });
        }
    };
    let sources = dep_info_sources(&ptx.with_extension("d"));
    Ok(Built { ptx, sources })
}

/// Compiles `linker.rs` with the host rustc into `out_dir` (once per content).
pub(crate) fn compile_linker(tc: &Toolchain, out_dir: &Path) -> Result<PathBuf, BuildError> {
    let dir = out_dir.join("ptx-linker");
    fs::create_dir_all(&dir).map_err(|error| BuildError::Io {
        path: dir.clone(),
        error,
    })?;
    let src = dir.join("linker.rs");
    let bin = dir.join("mscclpp-ptx-linker");
    let unchanged = fs::read_to_string(&src).is_ok_and(|s| s == LINKER_SOURCE) && bin.is_file();
    if unchanged {
        return Ok(bin);
    }
    fs::write(&src, LINKER_SOURCE).map_err(|error| BuildError::Io {
        path: src.clone(),
        error,
    })?;
    let mut cmd = tc.command("rustc");
    cmd.args([
        "--edition",
        "2021",
        "-O",
        "--crate-name",
        "mscclpp_ptx_linker",
    ])
    .arg(&src)
    .arg("-o")
    .arg(&bin);
    let out = cmd.output().map_err(|e| BuildError::Command {
        what: "compiling the PTX linker".into(),
        output: e.to_string(),
    })?;
    if !out.status.success() {
        return Err(BuildError::Command {
            what: "compiling the PTX linker".into(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(bin)
}

/// Source files listed in a Makefile-style dep-info file (`target: dep dep ...`).
pub(crate) fn dep_info_sources(path: &Path) -> Vec<PathBuf> {
    let Ok(text) = fs::read_to_string(path) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((_, deps)) = line.split_once(": ") else {
            continue;
        };
        let mut cur = String::new();
        let mut chars = deps.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.peek() == Some(&' ') => {
                    cur.push(' ');
                    chars.next();
                }
                ' ' => {
                    if !cur.is_empty() {
                        out.push(PathBuf::from(std::mem::take(&mut cur)));
                    }
                }
                _ => cur.push(c),
            }
        }
        if !cur.is_empty() {
            out.push(PathBuf::from(cur));
        }
    }
    out
}

pub(crate) fn package_name(manifest: &Path) -> Result<String, BuildError> {
    let text = fs::read_to_string(manifest).map_err(|error| BuildError::Io {
        path: manifest.to_path_buf(),
        error,
    })?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package
            && let Some(rest) = line.strip_prefix("name")
            && let Some(v) = rest.trim_start().strip_prefix('=')
        {
            return Ok(v.trim().trim_matches('"').replace('-', "_"));
        }
    }
    Err(BuildError::Command {
        what: format!("reading the package name from {}", manifest.display()),
        output: "no `name = ...` under [package]".into(),
    })
}
