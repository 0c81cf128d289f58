//! Where shared libraries that are opened at run time are looked for: NCCL (the perf tool's
//! `--compare nccl`, the NCCL library's fallback) and cuBLAS (the training example). They
//! are usually in Python wheels (PyTorch and NVIDIA's PyPI packages put them under
//! `site-packages/nvidia/...`) or in CUDA folders. Nothing here opens a library: callers
//! take the first folder holding one of their file names.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// The first of `names` that is a file in `dir`.
pub fn file_in(dir: &Path, names: &[&str]) -> Option<PathBuf> {
    names.iter().map(|n| dir.join(n)).find(|p| p.is_file())
}

/// Entries of `parent` whose names start with `prefix`, sorted.
fn entries_starting(parent: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// `python3`'s own module path (`sys.path` and the site folders), or nothing when there is
/// no `python3`.
fn python_paths() -> Vec<PathBuf> {
    let script = "import site, sys\n\
        paths = list(sys.path)\n\
        try:\n    paths += site.getsitepackages() + [site.getusersitepackages()]\n\
        except Exception:\n    pass\n\
        print('\\n'.join(p for p in paths if p))";
    match std::process::Command::new("python3")
        .args(["-c", script])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| PathBuf::from(l.trim()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Python site-packages folders, in order, each once: `PYTHONPATH`, then `python3`'s own
/// list when `ask_python` (a library loaded into someone else's process should not start
/// one), then `lib*/python3*/{site,dist}-packages` of `VIRTUAL_ENV`, `CONDA_PREFIX`, this
/// program's prefix (`<prefix>/bin/<exe>`: a Python program's own environment), every
/// `/opt/*/.venv` and `/opt/*`, `/usr`, `/usr/local` and `~/.local`.
pub fn site_packages(ask_python: bool) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PYTHONPATH")
        .map(|v| std::env::split_paths(&v).collect())
        .unwrap_or_default();
    if ask_python {
        dirs.extend(python_paths());
    }
    let mut prefixes: Vec<PathBuf> = ["VIRTUAL_ENV", "CONDA_PREFIX"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    if let Ok(exe) = std::fs::read_link("/proc/self/exe")
        && let Some(prefix) = exe.parent().and_then(Path::parent)
    {
        prefixes.push(prefix.to_path_buf());
    }
    for opt in entries_starting(Path::new("/opt"), "") {
        prefixes.push(opt.join(".venv"));
        prefixes.push(opt);
    }
    prefixes.extend(["/usr", "/usr/local"].map(PathBuf::from));
    if let Some(home) = std::env::var_os("HOME") {
        prefixes.push(PathBuf::from(home).join(".local"));
    }
    for prefix in prefixes {
        for lib in ["lib", "lib64"] {
            for py in entries_starting(&prefix.join(lib), "python3") {
                dirs.push(py.join("site-packages"));
                dirs.push(py.join("dist-packages"));
            }
        }
    }
    dirs.push(PathBuf::from("/usr/lib/python3/dist-packages"));
    let mut seen = HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// CUDA's and the system's library folders: `CUDA_HOME`/`CUDA_PATH`'s `lib64`,
/// `/usr/local/cuda/lib64`, every `/usr/local/cuda-*/lib64` (newest name first), then the
/// system folders.
pub fn cuda_lib_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
        .iter()
        .filter_map(std::env::var_os)
        .map(|h| PathBuf::from(h).join("lib64"))
        .collect();
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.extend(
        entries_starting(Path::new("/usr/local"), "cuda-")
            .into_iter()
            .rev()
            .map(|d| d.join("lib64")),
    );
    dirs.extend(
        [
            "/usr/lib/x86_64-linux-gnu",
            "/usr/lib/aarch64-linux-gnu",
            "/usr/lib64",
            "/usr/local/lib",
        ]
        .map(PathBuf::from),
    );
    dirs
}

/// Every folder to search for a library shipped in the wheel folders `wheel_dirs` (relative
/// to a site-packages folder, e.g. `nvidia/nccl/lib`): each site-packages folder
/// ([`site_packages`]) with each wheel folder, then `extra`, then [`cuda_lib_dirs`].
pub fn search_dirs(wheel_dirs: &[&str], ask_python: bool, extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for site in site_packages(ask_python) {
        for w in wheel_dirs {
            dirs.push(site.join(w));
        }
    }
    dirs.extend(extra.iter().cloned());
    dirs.extend(cuda_lib_dirs());
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wheel_folders_come_first_under_every_site_folder_then_extra_then_cuda() {
        let extra = [PathBuf::from("/somewhere/nccl/lib")];
        let d = search_dirs(&["nvidia/nccl/lib", "nvidia/cu13/lib"], false, &extra);
        let first_extra = d.iter().position(|p| p == &extra[0]).expect("extra listed");
        assert!(
            d[..first_extra]
                .iter()
                .all(|p| p.ends_with("nvidia/nccl/lib") || p.ends_with("nvidia/cu13/lib"))
        );
        assert!(d[first_extra..].contains(&PathBuf::from("/usr/local/cuda/lib64")));
        assert!(d.contains(&PathBuf::from(
            "/usr/lib/python3/dist-packages/nvidia/nccl/lib"
        )));
    }

    #[test]
    fn site_folders_are_listed_once() {
        let s = site_packages(false);
        let unique: HashSet<_> = s.iter().collect();
        assert_eq!(unique.len(), s.len());
    }

    #[test]
    fn file_in_takes_the_first_name_present() {
        let dir = std::env::temp_dir().join(format!("mscclpp-runtime-libs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libx.so.2"), b"").unwrap();
        assert_eq!(
            file_in(&dir, &["libx.so.3", "libx.so.2"]),
            Some(dir.join("libx.so.2"))
        );
        assert_eq!(file_in(&dir, &["liby.so"]), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
