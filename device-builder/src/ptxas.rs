//! Finding `ptxas` and compiling PTX to cubins with it.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BuildError;

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
