//! What a build produced ([`DeviceArtifacts`], one [`PtxArtifact`] per arch) and the files
//! made of it: the Rust module that embeds it, and a shipped-PTX directory.

use std::fs;
use std::path::{Path, PathBuf};

use crate::shipped::{self, PtxOrigin, STAMP_FILE, Stamp, StampedPtx};
use crate::{BuildError, find_ptxas, run_ptxas};

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
pub(crate) struct Provenance {
    pub(crate) toolchain: String,
    pub(crate) rustc: String,
    pub(crate) inputs: String,
}

/// What [`crate::DeviceBuilder::build`] produced: one PTX per requested arch.
#[derive(Debug, Clone)]
pub struct DeviceArtifacts {
    /// The PTX files, in the order of the requested arches.
    pub ptx: Vec<PtxArtifact>,
    /// Whether they were built here or taken from the shipped PTX.
    pub origin: PtxOrigin,
    pub(crate) out_dir: PathBuf,
    pub(crate) provenance: Option<Provenance>,
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
    /// [`crate::DeviceBuilder::shipped_ptx`]): copies each PTX into it, removes the `*.ptx`
    /// files of arches no longer built, and writes the [`STAMP_FILE`]. Only PTX built here
    /// (not taken from a shipped directory) can be shipped.
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

/// Compiles every PTX with ptxas when one is found (into `out_dir`) and assembles the
/// artifacts. A missing ptxas is an error when `require_ptxas`, and a warning for PTX built
/// here (a shipped PTX was checked when it was made).
pub(crate) fn finish(
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
