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
use std::fs;
use std::path::{Path, PathBuf};

mod arch;
mod artifacts;
mod error;
mod nested_build;
mod ptxas;
pub mod shipped;
mod toolchain;

pub use arch::{compute_capability, parse_arch_list};
pub use artifacts::{DeviceArtifacts, PtxArtifact};
pub use error::BuildError;
pub use ptxas::{find_ptxas, run_ptxas};
pub use shipped::{BuildMode, PtxOrigin, STAMP_FILE};

use artifacts::{Provenance, finish};
use nested_build::{cargo_build, compile_linker, package_name, recipe};
use shipped::Stamp;
use toolchain::{Toolchain, expected_toolchain};

/// The toolchain the device build needs when the outer build does not already run on a
/// nightly (the workspace pins this one in `rust-toolchain.toml`).
pub const PINNED_NIGHTLY: &str = "nightly-2026-05-19";

/// The rustc target the kernels are compiled for.
pub const NVPTX_TARGET: &str = "nvptx64-nvidia-cuda";

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

/// One build's settings: the builder's, else the environment's.
#[derive(Debug)]
struct Plan {
    /// The calling crate's directory (`CARGO_MANIFEST_DIR`).
    manifest_dir: PathBuf,
    crate_dir: PathBuf,
    manifest: PathBuf,
    out_dir: PathBuf,
    arches: Vec<(String, u32)>,
    require_ptxas: bool,
    mode: BuildMode,
}

/// A shipped PTX that was passed over as stale, for the nested build's warning or error.
#[derive(Debug)]
struct PassedOver {
    dir: PathBuf,
    reason: String,
    refresh: String,
}

/// What became of the shipped PTX in [`DeviceBuilder::build`].
#[derive(Debug)]
enum ShippedOutcome {
    /// It serves this build.
    Used(DeviceArtifacts),
    /// It is stale, and the nested build may replace it.
    PassedOver(PassedOver),
    /// There is none, or the nested build was asked for.
    NotTried,
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
        let plan = self.plan()?;
        // The shipped PTX first, unless the nested build is asked for.
        let passed_over = match self.try_shipped(&plan)? {
            ShippedOutcome::Used(artifacts) => return Ok(artifacts),
            ShippedOutcome::PassedOver(p) => Some(p),
            ShippedOutcome::NotTried => None,
        };
        if !plan.manifest.is_file() {
            return Err(BuildError::NoManifest(plan.crate_dir));
        }
        if plan.mode == BuildMode::Shipped && self.shipped.is_none() {
            return Err(BuildError::BadSetting {
                var: BuildMode::ENV,
                value: "shipped".into(),
                expected: "auto or nightly for a kernel crate that ships no PTX (its kernels \
                           can only be compiled, with a nightly)",
            });
        }
        let built = self.build_from_sources(
            &plan.crate_dir,
            &plan.manifest,
            &plan.out_dir,
            &plan.arches,
            plan.require_ptxas,
        );
        match (built, passed_over) {
            (Ok(a), None) => Ok(a),
            (
                Ok(a),
                Some(PassedOver {
                    dir,
                    reason,
                    refresh,
                }),
            ) => {
                println!(
                    "cargo:warning=the shipped PTX in {} is not used: {reason}; the kernels were \
                     compiled with a nightly instead. `{refresh}` refreshes it.",
                    dir.display()
                );
                Ok(a)
            }
            (Err(e), None) => Err(e),
            (
                Err(e),
                Some(PassedOver {
                    dir,
                    reason,
                    refresh,
                }),
            ) => Err(BuildError::ShippedUnusable {
                dir,
                reason,
                fix: format!("Refresh it with `{refresh}` on a machine with the pinned nightly."),
                build_error: Some(Box::new(e)),
            }),
        }
    }

    /// Resolves the settings of this build.
    fn plan(&self) -> Result<Plan, BuildError> {
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
        Ok(Plan {
            manifest_dir,
            crate_dir,
            manifest,
            out_dir,
            arches,
            require_ptxas,
            mode,
        })
    }

    /// Takes the shipped PTX when it can serve this build; an error when it cannot and the
    /// nested build may not replace it (`MSCCLPP_DEVICE_BUILD=shipped`, no kernel sources).
    fn try_shipped(&self, plan: &Plan) -> Result<ShippedOutcome, BuildError> {
        let Some((dir, refresh)) = &self.shipped else {
            return Ok(ShippedOutcome::NotTried);
        };
        let have_sources = plan.manifest.is_file();
        let dir = plan.manifest_dir.join(dir);
        println!("cargo:rerun-if-changed={}", dir.display());
        let unusable = |reason: String, fix: String| BuildError::ShippedUnusable {
            dir: dir.clone(),
            reason,
            fix,
            build_error: None,
        };
        if plan.mode == BuildMode::Nightly {
            if have_sources {
                return Ok(ShippedOutcome::NotTried);
            }
            return Err(unusable(
                format!(
                    "{}=nightly asks for a build from sources, and there is no kernel crate at {}",
                    BuildMode::ENV,
                    plan.crate_dir.display()
                ),
                "Build from the repository, where the kernel crate is.".into(),
            ));
        }
        let sources = have_sources.then_some(plan.crate_dir.as_path());
        match self.check_shipped(&dir, sources, &plan.arches)? {
            Ok(ptx) => {
                if have_sources {
                    println!("cargo:rerun-if-changed={}", plan.manifest.display());
                    println!(
                        "cargo:rerun-if-changed={}",
                        plan.crate_dir.join("src").display()
                    );
                }
                let origin = PtxOrigin::Shipped;
                finish(ptx, origin, None, &plan.out_dir, plan.require_ptxas)
                    .map(ShippedOutcome::Used)
            }
            Err(reason) if plan.mode == BuildMode::Shipped || !have_sources => {
                let fix = if have_sources {
                    format!(
                        "Refresh it with `{refresh}` (needs the pinned nightly), or unset {} to \
                         let this build compile the kernels with a nightly",
                        BuildMode::ENV
                    )
                } else {
                    "Without the kernel crate's sources (as in a packaged crate) only the \
                     shipped PTX can be used, for the arches it has; build from the repository \
                     for others"
                        .into()
                };
                Err(unusable(reason, fix))
            }
            Err(reason) => Ok(ShippedOutcome::PassedOver(PassedOver {
                dir,
                reason,
                refresh: refresh.clone(),
            })),
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
            let built = cargo_build(
                &toolchain,
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

#[cfg(test)]
mod tests;
