//! Compile a `#![no_std]` Rust kernel crate to PTX from a build script.
//!
//! This is the device half of the project's build: `host/build.rs` uses it for our own
//! kernels, and a user's crate uses it the same way for theirs:
//!
//! ```no_run
//! // in build.rs's main:
//! let ptx = mscclpp_device_builder::DeviceBuilder::new("kernels")
//!     .build()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! ptx.write_rust_module("kernels_ptx.rs").unwrap();
//! ```
//!
//! and then in the crate: `include!(concat!(env!("OUT_DIR"), "/kernels_ptx.rs"));`, which
//! defines `pub static PTX: &[(u32, &str)]` (compute capability × 10, PTX text) and
//! `pub static CUBIN: &[(u32, &[u8])]` (the same, compiled by ptxas; empty without one).
//!
//! How (docs/guide/06-design.md §3): a nested `cargo rustc` of the kernel crate for
//! `nvptx64-nvidia-cuda` with `-Zbuild-std=core`, `panic = "abort"` and fat LTO, in its own
//! target directory and a cleaned environment, once per requested arch (default `sm_90`;
//! `MSCCLPP_PTX_ARCHES` or [`DeviceBuilder::arches`] change the list). rustc's own bitcode
//! linker is replaced by a small program (compiled here from `linker.rs`) that runs
//! `llvm-link`, `opt` and `llc` from the `llvm-tools` component. Every PTX is compiled with
//! `ptxas` when one is found, and a missing `ptxas` is an error when
//! `MSCCLPP_REQUIRE_PTXAS=1`. The cubin ptxas writes is kept and embedded beside the PTX
//! (`CUBIN`): a GPU of that arch loads machine code at once, where PTX alone is compiled by
//! the driver on the first run on each machine (28-29 s of a 2-rank run on an H100 for our
//! 3 MB of PTX; cached afterwards where the driver's cache is writable).
//!
//! Shipped PTX ([`DeviceBuilder::shipped_ptx`], module [`shipped`]): a crate may carry the
//! PTX of its kernel crate in its sources, with a stamp of what it was built from. The build
//! then uses it instead of the nested build when it is up to date with the kernel crate's
//! sources, or when those are not there (a packaged crate): no nightly is needed, and ptxas
//! still makes a cubin of it when one is found. `MSCCLPP_DEVICE_BUILD` ([`BuildMode`])
//! forbids the nested build (`shipped`) or forces it (`nightly`); a stale shipped PTX is
//! rebuilt with a `cargo:warning`, never used silently.
//!
//! Validation: everything this crate needs (nightly toolchain, `rust-src`, `llvm-tools`,
//! `ptxas` when required) is checked up front, and each [`BuildError`] says how to install
//! the missing piece. A shipped PTX is checked against its stamp (file hashes, and the
//! kernel crate's sources where they are present). Nothing here validates the kernels
//! themselves beyond what rustc and ptxas report.

#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
#![deny(unsafe_code)]

use std::collections::BTreeSet;
use std::env;
use std::ffi::OsString;
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

pub mod shipped;

pub use shipped::{BuildMode, PtxOrigin, STAMP_FILE};
use shipped::{Stamp, StampedPtx};

/// The toolchain the device build needs when the outer build does not already run on a
/// nightly (the workspace pins this one in `rust-toolchain.toml`).
pub const PINNED_NIGHTLY: &str = "nightly-2026-05-19";

/// The rustc target the kernels are compiled for.
pub const NVPTX_TARGET: &str = "nvptx64-nvidia-cuda";

const LINKER_SOURCE: &str = include_str!("linker.rs");

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
fn recipe() -> String {
    format!(
        "target {NVPTX_TARGET}\nbuild-std core\nprofile {PROFILE:?}\n\
         rustflags -Ctarget-cpu=ARCH -Clinker=LINKER\nlinker\n{LINKER_SOURCE}"
    )
}

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
    /// `ptxas` is required (`MSCCLPP_REQUIRE_PTXAS=1` or [`DeviceBuilder::require_ptxas`])
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

/// One compiled PTX module.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PtxArtifact {
    /// `sm_XX` as requested.
    pub arch: String,
    /// Compute capability × 10 (`sm_90` → 90).
    pub compute_capability: u32,
    /// Where the PTX was written.
    pub path: PathBuf,
    /// The cubin `ptxas` compiled it to (machine code for exactly this arch and later
    /// minor versions of its major one), when a ptxas was found.
    pub cubin: Option<PathBuf>,
}

impl PtxArtifact {
    /// Whether `ptxas` compiled it successfully (false when no ptxas was found): it did
    /// when it left a cubin.
    pub fn ptxas_checked(&self) -> bool {
        self.cubin.is_some()
    }
}

/// What a nested build was made with, kept for [`DeviceArtifacts::write_shipped`].
#[derive(Debug, Clone)]
struct Provenance {
    toolchain: String,
    rustc: String,
    inputs: String,
}

/// What [`DeviceBuilder::build`] produced: one PTX per requested arch.
#[derive(Debug, Clone)]
pub struct DeviceArtifacts {
    /// The PTX files, in the order of the requested arches.
    pub ptx: Vec<PtxArtifact>,
    /// Whether they were built here or taken from the shipped PTX.
    pub origin: PtxOrigin,
    out_dir: PathBuf,
    provenance: Option<Provenance>,
}

impl DeviceArtifacts {
    /// Writes `OUT_DIR/<file_name>` for `include!`, defining `pub static PTX: &[(u32,
    /// &str)]`, a list of (compute capability × 10, PTX text), and `pub static CUBIN:
    /// &[(u32, &[u8])]`, the cubins ptxas made of them (empty when no ptxas was found).
    pub fn write_rust_module(&self, file_name: &str) -> Result<PathBuf, BuildError> {
        let mut s = String::from(
            "/// PTX compiled from the device crate: (compute capability x 10, PTX text).\n\
             pub static PTX: &[(u32, &str)] = &[\n",
        );
        for a in &self.ptx {
            s.push_str(&format!(
                "    ({}, include_str!({:?})),\n",
                a.compute_capability,
                a.path.display().to_string()
            ));
        }
        s.push_str(
            "];\n\n/// The PTX above compiled by ptxas: (compute capability x 10, cubin), for the \
             arches a ptxas was found for.\n#[allow(dead_code)]\npub static CUBIN: &[(u32, &[u8])] \
             = &[\n",
        );
        for a in &self.ptx {
            if let Some(cubin) = &a.cubin {
                s.push_str(&format!(
                    "    ({}, include_bytes!({:?})),\n",
                    a.compute_capability,
                    cubin.display().to_string()
                ));
            }
        }
        s.push_str("];\n");
        let path = self.out_dir.join(file_name);
        fs::write(&path, s).map_err(|error| BuildError::Io {
            path: path.clone(),
            error,
        })?;
        Ok(path)
    }

    /// Makes `dir` a shipped-PTX directory for these artifacts (see
    /// [`DeviceBuilder::shipped_ptx`]): copies each PTX into it, removes the `*.ptx` files of
    /// arches no longer built, and writes the [`STAMP_FILE`]. Only PTX built here (not taken
    /// from a shipped directory) can be shipped.
    pub fn write_shipped(&self, dir: impl AsRef<Path>) -> Result<(), BuildError> {
        let dir = dir.as_ref();
        let provenance = self
            .provenance
            .as_ref()
            .ok_or_else(|| BuildError::Command {
                what: format!("writing shipped PTX to {}", dir.display()),
                output: "this build used shipped PTX; set MSCCLPP_DEVICE_BUILD=nightly to \
                         build it from the kernel crate's sources"
                    .into(),
            })?;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |error| BuildError::Io { path, error }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let mut stamped = Vec::new();
        for a in &self.ptx {
            let file = a
                .path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            let dest = dir.join(&file);
            fs::copy(&a.path, &dest).map_err(io(&a.path))?;
            stamped.push(StampedPtx {
                arch: a.arch.clone(),
                hash: shipped::file_hash(&dest)?,
                file,
            });
        }
        for entry in fs::read_dir(dir).map_err(io(dir))? {
            let path = entry.map_err(io(dir))?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.ends_with(".ptx") && !stamped.iter().any(|p| p.file == name) {
                fs::remove_file(&path).map_err(io(&path))?;
            }
        }
        let stamp = Stamp {
            toolchain: provenance.toolchain.clone(),
            rustc: provenance.rustc.clone(),
            inputs: provenance.inputs.clone(),
            ptx: stamped,
        };
        let path = dir.join(STAMP_FILE);
        fs::write(&path, stamp.to_text()).map_err(io(&path))
    }
}

/// Builds a kernel crate to PTX. See the crate docs.
#[derive(Debug, Clone)]
pub struct DeviceBuilder {
    crate_dir: PathBuf,
    arches: Option<Vec<String>>,
    require_ptxas: Option<bool>,
    features: Vec<String>,
    out_dir: Option<PathBuf>,
    shipped: Option<(PathBuf, String)>,
    mode: Option<BuildMode>,
}

/// The toolchain a shipped PTX is expected to be built with: `MSCCLPP_DEVICE_TOOLCHAIN`, else
/// [`PINNED_NIGHTLY`].
fn expected_toolchain() -> String {
    env::var("MSCCLPP_DEVICE_TOOLCHAIN")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| PINNED_NIGHTLY.to_string())
}

impl DeviceBuilder {
    /// A builder for the kernel crate in `crate_dir` (relative paths are taken from the
    /// calling crate's `CARGO_MANIFEST_DIR`).
    pub fn new(crate_dir: impl Into<PathBuf>) -> Self {
        DeviceBuilder {
            crate_dir: crate_dir.into(),
            arches: None,
            require_ptxas: None,
            features: Vec::new(),
            out_dir: None,
            shipped: None,
            mode: None,
        }
    }

    /// The arches to build (`sm_90`, `sm_80`, ...). Default: `MSCCLPP_PTX_ARCHES`
    /// (comma-separated) or `sm_90`.
    pub fn arches<I, S>(mut self, arches: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.arches = Some(arches.into_iter().map(Into::into).collect());
        self
    }

    /// Fail when `ptxas` is not found (default: `MSCCLPP_REQUIRE_PTXAS=1`).
    pub fn require_ptxas(mut self, yes: bool) -> Self {
        self.require_ptxas = Some(yes);
        self
    }

    /// Cargo features to enable on the kernel crate.
    pub fn feature(mut self, f: impl Into<String>) -> Self {
        self.features.push(f.into());
        self
    }

    /// Where to put the PTX (default: `OUT_DIR`).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// Use the PTX shipped in `dir` (relative to `CARGO_MANIFEST_DIR`; written by
    /// [`DeviceArtifacts::write_shipped`]) instead of building when it is up to date, as
    /// [`BuildMode`] describes. `refresh` is the command that rewrites it, named in the
    /// warning and errors about a stale one (e.g. `scripts/update-ptx.sh`).
    pub fn shipped_ptx(mut self, dir: impl Into<PathBuf>, refresh: impl Into<String>) -> Self {
        self.shipped = Some((dir.into(), refresh.into()));
        self
    }

    /// Which PTX to use (default: `MSCCLPP_DEVICE_BUILD`, see [`BuildMode`]).
    pub fn mode(mut self, mode: BuildMode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Compiles the crate for every arch (or takes the shipped PTX), checks each PTX with
    /// ptxas when possible, and prints the `cargo:rerun-if-*` lines for the build script.
    pub fn build(self) -> Result<DeviceArtifacts, BuildError> {
        for var in [
            "MSCCLPP_PTX_ARCHES",
            "MSCCLPP_REQUIRE_PTXAS",
            "MSCCLPP_DEVICE_TOOLCHAIN",
            BuildMode::ENV,
            "PTXAS",
        ] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        let manifest_dir = env::var_os("CARGO_MANIFEST_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("."));
        let crate_dir = manifest_dir.join(&self.crate_dir);
        // `host/../device` reads better as `device` in messages.
        let crate_dir = fs::canonicalize(&crate_dir).unwrap_or(crate_dir);
        let manifest = crate_dir.join("Cargo.toml");
        let out_dir = match &self.out_dir {
            Some(d) => d.clone(),
            None => PathBuf::from(env::var_os("OUT_DIR").unwrap_or_else(|| "target".into())),
        };
        let arches = match &self.arches {
            Some(a) => a.clone(),
            None => parse_arch_list(&env::var("MSCCLPP_PTX_ARCHES").unwrap_or_default()),
        };
        let arches: Vec<(String, u32)> = arches
            .into_iter()
            .map(|a| compute_capability(&a).map(|cc| (a, cc)))
            .collect::<Result<_, _>>()?;
        let require_ptxas = self
            .require_ptxas
            .unwrap_or_else(|| env::var("MSCCLPP_REQUIRE_PTXAS").is_ok_and(|v| v == "1"));
        let mode = match self.mode {
            Some(m) => m,
            None => BuildMode::from_env()?,
        };
        let have_sources = manifest.is_file();

        // The shipped PTX first, unless the nested build is asked for.
        let mut passed_over = None;
        if let Some((dir, refresh)) = &self.shipped {
            let dir = manifest_dir.join(dir);
            println!("cargo:rerun-if-changed={}", dir.display());
            let unusable = |reason: String, fix: String| BuildError::ShippedUnusable {
                dir: dir.clone(),
                reason,
                fix,
                build_error: None,
            };
            if mode == BuildMode::Nightly && !have_sources {
                return Err(unusable(
                    format!(
                        "{}=nightly asks for a build from sources, and there is no kernel crate \
                         at {}",
                        BuildMode::ENV,
                        crate_dir.display()
                    ),
                    "Build from the repository, where the kernel crate is.".into(),
                ));
            }
            if mode != BuildMode::Nightly {
                let sources = have_sources.then_some(crate_dir.as_path());
                match self.check_shipped(&dir, sources, &arches)? {
                    Ok(ptx) => {
                        if have_sources {
                            println!("cargo:rerun-if-changed={}", manifest.display());
                            println!("cargo:rerun-if-changed={}", crate_dir.join("src").display());
                        }
                        return finish(ptx, PtxOrigin::Shipped, None, &out_dir, require_ptxas);
                    }
                    Err(reason) if mode == BuildMode::Shipped || !have_sources => {
                        let fix = if have_sources {
                            format!(
                                "Refresh it with `{refresh}` (needs the pinned nightly), or \
                                 unset {} to let this build compile the kernels with a nightly",
                                BuildMode::ENV
                            )
                        } else {
                            "Without the kernel crate's sources (as in a packaged crate) only \
                             the shipped PTX can be used, for the arches it has; build from the \
                             repository for others"
                                .into()
                        };
                        return Err(unusable(reason, fix));
                    }
                    Err(reason) => passed_over = Some((dir.clone(), reason, refresh.clone())),
                }
            }
        }
        if !have_sources {
            return Err(BuildError::NoManifest(crate_dir));
        }
        if mode == BuildMode::Shipped && self.shipped.is_none() {
            return Err(BuildError::BadSetting {
                var: BuildMode::ENV,
                value: "shipped".into(),
                expected: "auto or nightly for a kernel crate that ships no PTX (its kernels \
                           can only be compiled, with a nightly)",
            });
        }
        let built =
            self.build_from_sources(&crate_dir, &manifest, &out_dir, &arches, require_ptxas);
        match (built, passed_over) {
            (Ok(a), None) => Ok(a),
            (Ok(a), Some((dir, reason, refresh))) => {
                println!(
                    "cargo:warning=the shipped PTX in {} is not used: {reason}; the kernels were \
                     compiled with a nightly instead. `{refresh}` refreshes it.",
                    dir.display()
                );
                Ok(a)
            }
            (Err(e), None) => Err(e),
            (Err(e), Some((dir, reason, refresh))) => Err(BuildError::ShippedUnusable {
                dir,
                reason,
                fix: format!("Refresh it with `{refresh}` on a machine with the pinned nightly."),
                build_error: Some(Box::new(e)),
            }),
        }
    }

    /// The shipped PTX for `arches` when it can serve this build (`Ok(Ok)`), or why not
    /// (`Ok(Err)`); `Err` for a malformed stamp, which a rebuild must not paper over.
    /// With `sources` (the kernel crate's directory), the stamp must also match them.
    fn check_shipped(
        &self,
        dir: &Path,
        sources: Option<&Path>,
        arches: &[(String, u32)],
    ) -> Result<Result<Vec<PtxArtifact>, String>, BuildError> {
        let stamp = match Stamp::read(dir) {
            Ok(s) => s,
            Err(BuildError::Io { path, error }) if error.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Err(format!("there is no {}", path.display())));
            }
            Err(e) => return Err(e),
        };
        if let Some(crate_dir) = sources {
            let toolchain = expected_toolchain();
            if stamp.toolchain != toolchain {
                return Ok(Err(format!(
                    "it was built with {}, this build's kernels are for {toolchain}",
                    stamp.toolchain
                )));
            }
            let now = shipped::inputs_hash(crate_dir, &toolchain, &recipe(), &self.features)?;
            if stamp.inputs != now {
                return Ok(Err(format!(
                    "it is stale for the sources in {} (stamp {}, now {now})",
                    crate_dir.display(),
                    stamp.inputs
                )));
            }
        }
        let mut ptx = Vec::new();
        for (arch, cc) in arches {
            let Some(p) = stamp.ptx.iter().find(|p| &p.arch == arch) else {
                let have: Vec<&str> = stamp.ptx.iter().map(|p| p.arch.as_str()).collect();
                return Ok(Err(format!("it has no PTX for {arch} (only {have:?})")));
            };
            let path = dir.join(&p.file);
            let hash = match shipped::file_hash(&path) {
                Ok(h) => h,
                Err(e) => return Ok(Err(e.to_string())),
            };
            if hash != p.hash {
                return Ok(Err(format!(
                    "{} does not match its stamp (hash {hash}, stamp {})",
                    path.display(),
                    p.hash
                )));
            }
            ptx.push(PtxArtifact {
                arch: arch.clone(),
                compute_capability: *cc,
                path,
                cubin: None,
            });
        }
        Ok(Ok(ptx))
    }

    fn build_from_sources(
        &self,
        crate_dir: &Path,
        manifest: &Path,
        out_dir: &Path,
        arches: &[(String, u32)],
        require_ptxas: bool,
    ) -> Result<DeviceArtifacts, BuildError> {
        let toolchain = Toolchain::find()?;
        // Before the build, so that an edit during it makes the stamp stale, not wrong.
        let inputs =
            shipped::inputs_hash(crate_dir, &expected_toolchain(), &recipe(), &self.features)?;
        if require_ptxas {
            find_ptxas()?;
        }
        let linker = compile_linker(&toolchain, out_dir)?;
        let crate_name = package_name(manifest)?;
        let mut ptx = Vec::new();
        let mut sources = BTreeSet::new();
        for (arch, cc) in arches {
            let built = toolchain.cargo_build(
                manifest,
                &out_dir.join("device-target").join(arch),
                arch,
                &linker,
                &self.features,
            )?;
            sources.extend(built.sources);
            let dest = out_dir.join(format!("{crate_name}.{arch}.ptx"));
            fs::copy(&built.ptx, &dest).map_err(|error| BuildError::Io {
                path: built.ptx.clone(),
                error,
            })?;
            ptx.push(PtxArtifact {
                arch: arch.clone(),
                compute_capability: *cc,
                path: dest,
                cubin: None,
            });
        }
        let sysroot = toolchain.sysroot.clone();
        for s in sources {
            if !s.starts_with(&sysroot) {
                println!("cargo:rerun-if-changed={}", s.display());
            }
        }
        println!("cargo:rerun-if-changed={}", manifest.display());
        let provenance = Provenance {
            toolchain: expected_toolchain(),
            rustc: toolchain.rustc_version.clone(),
            inputs,
        };
        finish(
            ptx,
            PtxOrigin::Built,
            Some(provenance),
            out_dir,
            require_ptxas,
        )
    }
}

/// Compiles every PTX with ptxas when one is found (into `out_dir`) and assembles the
/// artifacts. A missing ptxas is an error when `require_ptxas`, and a warning for PTX built
/// here (a shipped PTX was checked when it was made).
fn finish(
    mut ptx: Vec<PtxArtifact>,
    origin: PtxOrigin,
    provenance: Option<Provenance>,
    out_dir: &Path,
    require_ptxas: bool,
) -> Result<DeviceArtifacts, BuildError> {
    match find_ptxas() {
        Ok(ptxas) => {
            for a in &mut ptx {
                a.cubin = Some(run_ptxas(&ptxas, &a.path, &a.arch, out_dir)?);
            }
        }
        Err(e) if require_ptxas => return Err(e),
        Err(e) => {
            if origin == PtxOrigin::Built {
                println!("cargo:warning=PTX not checked with ptxas: {e}");
            }
        }
    }
    Ok(DeviceArtifacts {
        ptx,
        origin,
        out_dir: out_dir.to_path_buf(),
        provenance,
    })
}

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

fn package_name(manifest: &Path) -> Result<String, BuildError> {
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

/// The nightly toolchain used for the nested build.
#[derive(Debug, Clone)]
struct Toolchain {
    /// Set when the nested cargo must be pointed at a toolchain other than the ambient one.
    rustup_toolchain: Option<String>,
    name: String,
    /// `rustc -V` of it, without the `rustc ` prefix: `1.97.0-nightly (abc123def 2026-05-18)`.
    rustc_version: String,
    sysroot: PathBuf,
    llvm_tools: PathBuf,
}

struct Built {
    ptx: PathBuf,
    sources: Vec<PathBuf>,
}

impl Toolchain {
    fn find() -> Result<Toolchain, BuildError> {
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
    fn command(&self, tool: &str) -> Command {
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

    fn cargo_build(
        &self,
        manifest: &Path,
        target_dir: &Path,
        arch: &str,
        linker: &Path,
        features: &[String],
    ) -> Result<Built, BuildError> {
        let mut cmd = self.command("cargo");
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
        cmd.env("MSCCLPP_LLVM_TOOLS_DIR", &self.llvm_tools);
        if let Some(dir) = manifest.parent() {
            cmd.current_dir(dir);
        }
        let what = format!(
            "building device crate {} for {arch} with {}",
            manifest.display(),
            self.name
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

/// Compiles `linker.rs` with the host rustc into `out_dir` (once per content).
fn compile_linker(tc: &Toolchain, out_dir: &Path) -> Result<PathBuf, BuildError> {
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
fn dep_info_sources(path: &Path) -> Vec<PathBuf> {
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

/// Finds ptxas: `PTXAS`, `PATH`, `CUDA_HOME`/`CUDA_PATH`, /usr/local/cuda, then the
/// `nvidia-cuda-nvcc` pip package of `python3`. `PTXAS=none` finds none (a build that must
/// show it needs no ptxas).
pub fn find_ptxas() -> Result<PathBuf, BuildError> {
    let mut searched = Vec::new();
    if env::var_os("PTXAS").is_some_and(|p| p == "none") {
        return Err(BuildError::NoPtxas {
            searched: vec!["nothing (PTXAS=none turns ptxas off)".into()],
        });
    }
    if let Some(p) = env::var_os("PTXAS") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        searched.push(format!("PTXAS={}", p.display()));
    }
    if let Some(path) = env::var_os("PATH") {
        for dir in env::split_paths(&path) {
            let p = dir.join("ptxas");
            if p.is_file() {
                return Ok(p);
            }
        }
        searched.push("PATH".into());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = env::var_os(var) {
            let p = PathBuf::from(home).join("bin/ptxas");
            if p.is_file() {
                return Ok(p);
            }
            searched.push(format!("${var}/bin"));
        }
    }
    let p = PathBuf::from("/usr/local/cuda/bin/ptxas");
    if p.is_file() {
        return Ok(p);
    }
    searched.push("/usr/local/cuda/bin".into());
    // The pip package installs a namespace package `nvidia` with cu13/bin or cuda_nvcc/bin.
    let py = "import nvidia, os\nfor d in nvidia.__path__:\n  for s in ('cu13/bin','cu12/bin','cuda_nvcc/bin'):\n    p=os.path.join(d,s,'ptxas')\n    if os.path.isfile(p): print(p); raise SystemExit\n";
    for python in ["python3", "python"] {
        if let Ok(out) = Command::new(python).args(["-c", py]).output() {
            let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if out.status.success() && !s.is_empty() && Path::new(&s).is_file() {
                return Ok(PathBuf::from(s));
            }
        }
    }
    searched.push("python3's nvidia-cuda-nvcc package".into());
    Err(BuildError::NoPtxas { searched })
}

/// Compiles `ptx` with `ptxas -arch=<arch>` into `<out_dir>/<ptx file name>.cubin` and
/// returns that path; an error carries ptxas's messages.
pub fn run_ptxas(
    ptxas: &Path,
    ptx: &Path,
    arch: &str,
    out_dir: &Path,
) -> Result<PathBuf, BuildError> {
    let cubin = out_dir.join(format!(
        "{}.cubin",
        ptx.file_name().unwrap_or_default().to_string_lossy()
    ));
    // A cubin of an earlier build must not pass for this one's.
    let _ = fs::remove_file(&cubin);
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg(ptx)
        .arg("-o")
        .arg(&cubin)
        .output()
        .map_err(|e| BuildError::Command {
            what: format!("running {}", ptxas.display()),
            output: e.to_string(),
        })?;
    let output = if !out.status.success() {
        String::from_utf8_lossy(&out.stderr).into_owned()
    } else if !cubin.is_file() {
        format!("ptxas exited with success but wrote no {}", cubin.display())
    } else {
        return Ok(cubin);
    };
    let _ = fs::remove_file(&cubin);
    Err(BuildError::Ptxas {
        ptx: ptx.to_path_buf(),
        arch: arch.to_string(),
        output,
    })
}

#[cfg(test)]
mod tests;
