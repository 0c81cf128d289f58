//! The nightly toolchain of the nested build: which one, what it has (`rust-src`,
//! `llvm-tools`), and commands of it run in an environment cleaned of the outer build's.

use std::env;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::Command;

use crate::{BuildError, PINNED_NIGHTLY};

/// The toolchain a shipped PTX is expected to be built with: `MSCCLPP_DEVICE_TOOLCHAIN`, else
/// [`PINNED_NIGHTLY`].
pub(crate) fn expected_toolchain() -> String {
    env::var("MSCCLPP_DEVICE_TOOLCHAIN")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| PINNED_NIGHTLY.to_string())
}

/// The nightly toolchain used for the nested build.
#[derive(Debug, Clone)]
pub(crate) struct Toolchain {
    /// Set when the nested cargo must be pointed at a toolchain other than the ambient one.
    rustup_toolchain: Option<String>,
    pub(crate) name: String,
    /// `rustc -V` of it, without the `rustc ` prefix: `1.97.0-nightly (abc123def 2026-05-18)`.
    pub(crate) rustc_version: String,
    pub(crate) sysroot: PathBuf,
    pub(crate) llvm_tools: PathBuf,
}

impl Toolchain {
    pub(crate) fn find() -> Result<Toolchain, BuildError> {
        // Which toolchain: explicit override, else the ambient one if it is a nightly, else
        // the pinned nightly through rustup.
        let explicit = env::var("MSCCLPP_DEVICE_TOOLCHAIN")
            .ok()
            .filter(|s| !s.is_empty());
        let candidates: Vec<Option<String>> = match explicit {
            Some(t) => vec![Some(t)],
            None => vec![None, Some(PINNED_NIGHTLY.to_string())],
        };
        let mut detail = String::new();
        for tc in candidates {
            let vv = match rustc_output(tc.as_deref(), &["-vV"]) {
                Ok(v) => v,
                Err(e) => {
                    detail = e;
                    continue;
                }
            };
            let release = vv
                .lines()
                .find_map(|l| l.strip_prefix("release: "))
                .unwrap_or("")
                .to_string();
            if !release.contains("nightly") && !release.contains("dev") {
                detail = format!("rustc is {release}, not a nightly");
                continue;
            }
            let field = |key: &str| {
                vv.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .unwrap_or("")
                    .to_string()
            };
            let host = field("host: ");
            let commit = field("commit-hash: ");
            let rustc_version = format!(
                "{release} ({} {})",
                commit.get(..9).unwrap_or(&commit),
                field("commit-date: ")
            );
            let sysroot = PathBuf::from(
                rustc_output(tc.as_deref(), &["--print", "sysroot"])
                    .map_err(|detail| BuildError::NoNightly { detail })?
                    .trim(),
            );
            let name = tc.clone().unwrap_or_else(|| {
                env::var("RUSTUP_TOOLCHAIN").unwrap_or_else(|_| format!("nightly ({release})"))
            });
            let core = sysroot.join("lib/rustlib/src/rust/library/core/Cargo.toml");
            if !core.is_file() {
                return Err(BuildError::MissingComponent {
                    component: "rust-src",
                    toolchain: name,
                    looked_for: core,
                });
            }
            let llvm_tools = sysroot.join("lib/rustlib").join(&host).join("bin");
            for tool in ["llvm-link", "opt", "llc", "llvm-ar"] {
                let p = llvm_tools.join(tool);
                if !p.is_file() {
                    return Err(BuildError::MissingComponent {
                        component: "llvm-tools",
                        toolchain: name,
                        looked_for: p,
                    });
                }
            }
            return Ok(Toolchain {
                rustup_toolchain: tc,
                name,
                rustc_version,
                sysroot,
                llvm_tools,
            });
        }
        Err(BuildError::NoNightly { detail })
    }

    /// A command for `tool` (cargo or rustc) of this toolchain with the outer build's
    /// environment removed.
    pub(crate) fn command(&self, tool: &str) -> Command {
        let mut cmd = match &self.rustup_toolchain {
            Some(tc) => {
                let mut c = Command::new("rustup");
                c.args(["run", tc, tool]);
                c
            }
            None => Command::new(tool),
        };
        clean_env(&mut cmd);
        if self.rustup_toolchain.is_none()
            && let Ok(tc) = env::var("RUSTUP_TOOLCHAIN")
        {
            cmd.env("RUSTUP_TOOLCHAIN", tc);
        }
        cmd
    }
}

fn rustc_output(toolchain: Option<&str>, args: &[&str]) -> Result<String, String> {
    let mut cmd = match toolchain {
        Some(tc) => {
            let mut c = Command::new("rustup");
            c.args(["run", tc, "rustc"]);
            c
        }
        None => Command::new("rustc"),
    };
    clean_env(&mut cmd);
    if toolchain.is_none()
        && let Ok(tc) = env::var("RUSTUP_TOOLCHAIN")
    {
        cmd.env("RUSTUP_TOOLCHAIN", tc);
    }
    let out = cmd
        .args(args)
        .output()
        .map_err(|e| format!("cannot run rustc ({e})"))?;
    if !out.status.success() {
        return Err(format!(
            "rustc {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes what the outer cargo set for its own compilation, so that the nested build
/// compiles for nvptx with our flags only.
fn clean_env(cmd: &mut Command) {
    const EXACT: &[&str] = &[
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_LINKER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_CRATE_NAME",
        "OUT_DIR",
        "TARGET",
        "HOST",
        "PROFILE",
        "OPT_LEVEL",
        "DEBUG",
        "NUM_JOBS",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
        "CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER",
    ];
    const PREFIXES: &[&str] = &["CARGO_CFG_", "CARGO_FEATURE_", "CARGO_PKG_", "DEP_"];
    let remove: Vec<OsString> = env::vars_os()
        .map(|(k, _)| k)
        .filter(|k| {
            let k = k.to_string_lossy();
            EXACT.contains(&k.as_ref()) || PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .collect();
    for k in remove {
        cmd.env_remove(k);
    }
}
