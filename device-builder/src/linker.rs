//! The PTX linker that `mscclpp-device-builder` hands to rustc as `-C linker=`.
//!
//! rustc's `nvptx64-nvidia-cuda` target links with `llvm-bitcode-linker`, a rustup component
//! that cannot always be installed. This small program does the same job with the
//! `llvm-tools` binaries: `llvm-link` the bitcode objects (and, only as needed, the bitcode
//! inside rlibs such as compiler_builtins), `opt` with the exported kernels kept
//! (internalize + O3 + globaldce), then `llc` for the requested `sm_XX`.
//!
//! It is compiled by the build script with plain `rustc`, so it uses std only.
//! The directory with the LLVM tools comes from `MSCCLPP_LLVM_TOOLS_DIR`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mscclpp-ptx-linker: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut inputs = Vec::new();
    let mut archives = Vec::new();
    let mut exports = Vec::new();
    let mut output = None;
    let mut cpu = None;
    let mut args = env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-o" => output = args.next().map(PathBuf::from),
            "--export-symbol" => exports.extend(args.next()),
            "--target-cpu" => cpu = args.next(),
            // Search paths, target name and rustc's optimisation/debug hints: the real work is
            // fixed below (O3 in opt, no debug info in PTX).
            "-L" | "--target" => {
                args.next();
            }
            _ if a.starts_with('-') => {}
            _ if a.ends_with(".rlib") || a.ends_with(".a") => archives.push(PathBuf::from(a)),
            _ => inputs.push(PathBuf::from(a)),
        }
    }
    let output = output.ok_or("no -o OUTPUT given")?;
    let cpu = cpu.ok_or("no --target-cpu given (expected sm_XX)")?;
    if inputs.is_empty() {
        return Err("no bitcode object to link".into());
    }
    let tools = PathBuf::from(
        env::var_os("MSCCLPP_LLVM_TOOLS_DIR").ok_or("MSCCLPP_LLVM_TOOLS_DIR is not set")?,
    );
    let work = output.with_extension("link");
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;

    // Bitcode members of the archives, linked only where the program needs them.
    let mut extra = Vec::new();
    for (i, ar) in archives.iter().enumerate() {
        let dir = work.join(format!("ar{i}"));
        fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let abs = fs::canonicalize(ar).map_err(|e| format!("{}: {e}", ar.display()))?;
        let mut cmd = Command::new(tools.join("llvm-ar"));
        cmd.arg("x").arg(&abs).current_dir(&dir);
        exec(&mut cmd)?;
        for entry in fs::read_dir(&dir).map_err(|e| e.to_string())? {
            let p = entry.map_err(|e| e.to_string())?.path();
            if is_bitcode(&p) {
                extra.push(p);
            }
        }
    }
    extra.sort();

    let linked = work.join("linked.bc");
    let mut cmd = Command::new(tools.join("llvm-link"));
    cmd.args(&inputs).arg("-o").arg(&linked);
    exec(&mut cmd)?;
    let mut current = linked;
    if !extra.is_empty() {
        let with_extra = work.join("linked-extra.bc");
        // llvm-link applies --only-needed to every file after the first.
        let mut cmd = Command::new(tools.join("llvm-link"));
        cmd.arg("--only-needed")
            .arg(&current)
            .args(&extra)
            .arg("-o")
            .arg(&with_extra);
        exec(&mut cmd)?;
        current = with_extra;
    }

    let optimized = work.join("opt.bc");
    let mut cmd = Command::new(tools.join("opt"));
    cmd.arg(format!("--internalize-public-api-list={}", exports.join(",")))
        .arg("--passes=internalize,default<O3>,globaldce")
        .arg(&current)
        .arg("-o")
        .arg(&optimized);
    exec(&mut cmd)?;

    let mut cmd = Command::new(tools.join("llc"));
    cmd.arg("-march=nvptx64")
        .arg(format!("-mcpu={cpu}"))
        .arg("-O3")
        .arg(&optimized)
        .arg("-o")
        .arg(&output);
    exec(&mut cmd)?;
    apply_launch_bounds(&output)?;
    let _ = fs::remove_dir_all(&work);
    Ok(())
}

/// Marker that `mscclpp_device::launch_bounds!` leaves in the module's PTX (a comment line
/// from `global_asm!`): `// mscclpp:maxntid <kernel> <threads>`.
const MAXNTID_MARKER: &str = "// mscclpp:maxntid ";

/// Adds `.maxntid <threads>, 1, 1` to every entry named by a marker, between its parameter
/// list and its body, so ptxas budgets registers for that many threads per block. A marker
/// naming no entry is an error (a typo would otherwise silently drop the bound).
fn apply_launch_bounds(ptx_path: &Path) -> Result<(), String> {
    let ptx = fs::read_to_string(ptx_path).map_err(|e| format!("{}: {e}", ptx_path.display()))?;
    let mut bounds = Vec::new();
    for line in ptx.lines() {
        if let Some(rest) = line.trim().strip_prefix(MAXNTID_MARKER) {
            let mut it = rest.split_whitespace();
            match (it.next(), it.next().and_then(|n| n.parse::<u32>().ok())) {
                (Some(k), Some(n)) if (1..=1024).contains(&n) => bounds.push((k.to_string(), n)),
                _ => return Err(format!("malformed launch bound marker: {line}")),
            }
        }
    }
    if bounds.is_empty() {
        return Ok(());
    }
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut pending: Option<u32> = None;
    let mut found = vec![false; bounds.len()];
    for line in ptx.lines() {
        let t = line.trim();
        if let Some(name) = t.strip_prefix(".visible .entry ").and_then(|r| r.split('(').next()) {
            if let Some(i) = bounds.iter().position(|(k, _)| k == name) {
                pending = Some(bounds[i].1);
                found[i] = true;
            }
        }
        if t == "{" {
            if let Some(n) = pending.take() {
                out.push_str(&format!(".maxntid {n}, 1, 1\n"));
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    if let Some(i) = found.iter().position(|f| !f) {
        return Err(format!("launch bound for `{}`, which is not a kernel of this module", bounds[i].0));
    }
    fs::write(ptx_path, out).map_err(|e| format!("{}: {e}", ptx_path.display()))
}

fn is_bitcode(p: &Path) -> bool {
    fs::read(p)
        .map(|b| b.starts_with(b"BC\xC0\xDE"))
        .unwrap_or(false)
}

fn exec(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{:?} failed ({}):\n{}",
            cmd,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
