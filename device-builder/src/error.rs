//! [`BuildError`]: everything that can go wrong in a device build, each with what to do.

use std::fmt;
use std::path::PathBuf;

use crate::PINNED_NIGHTLY;

/// Everything that can go wrong, each with what to do about it.
#[derive(Debug)]
pub enum BuildError {
    /// The kernel crate's directory has no `Cargo.toml`.
    NoManifest(PathBuf),
    /// No nightly toolchain is available for the device build.
    NoNightly {
        /// What `rustc -vV` said, or why it could not run.
        detail: String,
    },
    /// A rustup component is missing from the toolchain.
    MissingComponent {
        /// The component, e.g. `rust-src`.
        component: &'static str,
        /// The toolchain it is missing from.
        toolchain: String,
        /// The path that was looked for.
        looked_for: PathBuf,
    },
    /// An arch string is not of the form `sm_XX`.
    BadArch(String),
    /// `ptxas` is required (`MSCCLPP_REQUIRE_PTXAS=1` or [`crate::DeviceBuilder::require_ptxas`])
    /// but was not found.
    NoPtxas {
        /// The places that were searched.
        searched: Vec<String>,
    },
    /// A command failed.
    Command {
        /// What was being done.
        what: String,
        /// Its stderr (or the spawn error).
        output: String,
    },
    /// `ptxas` rejected a PTX file.
    Ptxas {
        /// The PTX file.
        ptx: PathBuf,
        /// The arch it was compiled for.
        arch: String,
        /// ptxas's messages.
        output: String,
    },
    /// An environment variable has a value this crate does not understand.
    BadSetting {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// The values it may take.
        expected: &'static str,
    },
    /// A shipped PTX's stamp file is malformed.
    BadStamp {
        /// The stamp file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// The shipped PTX cannot serve this build, and the nested nightly build may not
    /// (`MSCCLPP_DEVICE_BUILD=shipped`, or no kernel crate sources) or could not replace it.
    ShippedUnusable {
        /// The shipped-PTX directory.
        dir: PathBuf,
        /// Why it cannot be used.
        reason: String,
        /// What to do about it.
        fix: String,
        /// The nested build's error, when it was tried.
        build_error: Option<Box<BuildError>>,
    },
    /// A file could not be read or written.
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        error: std::io::Error,
    },
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildError::NoManifest(p) => {
                write!(f, "device crate: no Cargo.toml in {}", p.display())
            }
            BuildError::NoNightly { detail } => write!(
                f,
                "device build needs a nightly Rust toolchain (-Zbuild-std, nvptx inline asm); \
                 {detail}. Install it with `rustup toolchain install {PINNED_NIGHTLY} \
                 --component rust-src,llvm-tools` or set MSCCLPP_DEVICE_TOOLCHAIN to a nightly \
                 you have"
            ),
            BuildError::MissingComponent {
                component,
                toolchain,
                looked_for,
            } => write!(
                f,
                "device build needs the `{component}` component of toolchain {toolchain} \
                 (looked for {}). Install it with `rustup component add {component} \
                 --toolchain {toolchain}`",
                looked_for.display()
            ),
            BuildError::BadArch(a) => write!(
                f,
                "PTX arch `{a}` is not of the form sm_XX (e.g. sm_90, sm_80); \
                 check MSCCLPP_PTX_ARCHES"
            ),
            BuildError::NoPtxas { searched } => write!(
                f,
                "ptxas is required to check the PTX but was not found (searched: {}). \
                 Install it with `pip install nvidia-cuda-nvcc` (ptxas lands in \
                 site-packages/nvidia/cu13/bin), or point PTXAS at a ptxas binary",
                searched.join(", ")
            ),
            BuildError::Command { what, output } => write!(f, "{what} failed:\n{output}"),
            BuildError::Ptxas { ptx, arch, output } => write!(
                f,
                "ptxas -arch={arch} rejected {}:\n{output}",
                ptx.display()
            ),
            BuildError::BadSetting {
                var,
                value,
                expected,
            } => write!(f, "{var}={value:?} is not understood; expected {expected}"),
            BuildError::BadStamp { path, detail } => write!(
                f,
                "shipped PTX stamp {}: {detail}; rebuild it rather than edit it",
                path.display()
            ),
            BuildError::ShippedUnusable {
                dir,
                reason,
                fix,
                build_error,
            } => {
                write!(
                    f,
                    "the shipped PTX in {} cannot be used: {reason}. {fix}",
                    dir.display()
                )?;
                if let Some(e) = build_error {
                    write!(f, "\nThe nightly build that would replace it failed: {e}")?;
                }
                Ok(())
            }
            BuildError::Io { path, error } => write!(f, "{}: {error}", path.display()),
        }
    }
}

impl std::error::Error for BuildError {}
