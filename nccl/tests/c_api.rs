//! The C library as a C program sees it: `tests/c/smoke.c` compiled with `cc` against
//! `include/nccl.h` and linked to the built `libmscclpp_nccl.so`, and the exported symbols
//! read with `nm -D`. No GPU needed (without one, the smoke program also checks that
//! `ncclCommInitRank` fails at once, naming the missing GPU).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Every NCCL entry point the library must export (each also under its `pnccl` name).
const EXPORTS: &[&str] = &[
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRank",
    "ncclCommInitRankConfig",
    "ncclCommInitAll",
    "ncclCommInitRankScalable",
    "ncclCommSplit",
    "ncclCommShrink",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommRevoke",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommGetAsyncError",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclResetDebugInit",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclBcast",
    "ncclReduce",
    "ncclSend",
    "ncclRecv",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclCommRegister",
    "ncclCommDeregister",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclTeamWorld",
    "ncclTeamLsa",
    "ncclTeamRail",
    "ncclTeamRankToWorld",
    "ncclTeamRankToLsa",
    "ncclGinBarrierCreateRequirement",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
];

/// Entry points without a `pnccl` twin.
const EXPORTS_ONLY: &[&str] = &["mscclpp_nccl_is_not_nccl"];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The built `libmscclpp_nccl.so`: `target/<profile>/deps/` (where `cargo test` builds the
/// library's cdylib beside the rlib this test links, so it is as fresh), else
/// `target/<profile>/` (`cargo build`).
fn cdylib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let profile_dir = deps.parent().expect("target/<profile>/deps/<test>");
    [deps, profile_dir]
        .iter()
        .map(|d| d.join("libmscclpp_nccl.so"))
        .find(|l| l.is_file())
        .unwrap_or_else(|| {
            panic!(
                "libmscclpp_nccl.so is in neither {} nor {}: build the library (cargo build -p mscclpp-nccl)",
                deps.display(),
                profile_dir.display()
            )
        })
}

fn tool(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// Runs `cmd` to completion within `limit`, killing it past that.
fn run_with_limit(mut cmd: Command, limit: Duration) -> (Option<i32>, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            let out = child.wait_with_output().expect("output");
            return (
                status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            );
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "timed out after {limit:?} (a hang); stdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn gpu_present() -> bool {
    matches!(mscclpp_host::cuda::device_count(), Ok(n) if n > 0)
}

#[test]
fn c_program_calls_the_library() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let lib = cdylib();
    let lib_dir = lib.parent().unwrap();
    let out_dir = std::env::temp_dir().join(format!("mscclpp-nccl-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let exe = out_dir.join("smoke");
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("tests/c/smoke.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(lib_dir)
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-lmscclpp_nccl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc} (a C compiler is needed): {e}"));
    assert!(status.success(), "compiling tests/c/smoke.c failed");
    let mut cmd = Command::new(&exe);
    // No real NCCL for this run, whatever the machine has: the results are ours. The
    // library linked, not another build of it: cargo's LD_LIBRARY_PATH (which wins over the
    // run path) also lists target/<profile>/, where `cargo build` leaves its own copy; its
    // folder goes first (the rest kept: the driver may be found through it).
    let mut path = std::ffi::OsString::from(lib_dir);
    if let Some(rest) = std::env::var_os("LD_LIBRARY_PATH") {
        path.push(":");
        path.push(rest);
    }
    cmd.env("LD_LIBRARY_PATH", path)
        .env("MSCCLPP_NCCL_LIB", "/nonexistent/libnccl.so.2")
        .env("MSCCLPP_DEBUG", "WARN");
    if !gpu_present() {
        cmd.env("MSCCLPP_SMOKE_NO_GPU", "1");
    } else {
        eprintln!("a GPU is present: the no-GPU set-up checks are skipped");
    }
    let (code, stdout, stderr) = run_with_limit(cmd, Duration::from_secs(60));
    println!("{stdout}");
    eprintln!("{stderr}");
    assert_eq!(code, Some(0), "smoke program failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("smoke: 0 failure(s)"), "{stdout}");
    if !gpu_present() {
        assert!(stdout.contains("no GPU"), "{stdout}");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

/// `nccl/scripts/install.sh` lays the library out as a drop-in NCCL: a C program compiled
/// against the installed header and linked with `-lnccl` runs on our library, found through
/// `LD_LIBRARY_PATH` as `libnccl.so` (the dynamic loader's own record says from where).
#[test]
fn installed_as_libnccl_a_c_program_links_and_runs_on_it() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let prefix = std::env::temp_dir().join(format!("mscclpp-nccl-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    let status = Command::new("bash")
        .arg(crate_dir().join("scripts/install.sh"))
        .arg(&prefix)
        .arg(cdylib())
        .status()
        .expect("bash");
    assert!(status.success(), "install.sh failed");
    let lib = prefix.join("lib");
    for link in ["libnccl.so.2", "libnccl.so"] {
        let target = std::fs::read_link(lib.join(link)).expect(link);
        assert_eq!(target, PathBuf::from("libmscclpp_nccl.so"), "{link}");
    }
    let exe = prefix.join("smoke");
    let status = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(prefix.join("include"))
        .arg(crate_dir().join("tests/c/smoke.c"))
        .arg("-o")
        .arg(&exe)
        .arg("-L")
        .arg(&lib)
        .arg("-lnccl")
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cc} (a C compiler is needed): {e}"));
    assert!(
        status.success(),
        "compiling tests/c/smoke.c with -lnccl failed"
    );
    let mut cmd = Command::new(&exe);
    cmd.env("LD_LIBRARY_PATH", &lib)
        .env("LD_DEBUG", "libs")
        .env("LD_DEBUG_OUTPUT", prefix.join("ld"))
        .env("MSCCLPP_NCCL_LIB", "/nonexistent/libnccl.so.2")
        .env("MSCCLPP_DEBUG", "WARN");
    if !gpu_present() {
        cmd.env("MSCCLPP_SMOKE_NO_GPU", "1");
    }
    let (code, stdout, stderr) = run_with_limit(cmd, Duration::from_secs(60));
    assert_eq!(code, Some(0), "smoke program failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("smoke: 0 failure(s)"), "{stdout}");
    // The dynamic loader's own account (LD_DEBUG_OUTPUT writes `ld.<pid>`): libnccl.so was
    // loaded from the prefix.
    let loaded = format!("calling init: {}", lib.join("libnccl.so").display());
    let account: String = std::fs::read_dir(&prefix)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("ld."))
        .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
        .collect();
    assert!(
        account.lines().any(|l| l.contains(&loaded)),
        "libnccl.so did not come from {}:\n{account}",
        lib.display()
    );
    let _ = std::fs::remove_dir_all(&prefix);
}

/// The exported dynamic symbols of the library.
fn exported() -> Vec<String> {
    let nm = tool("nm").expect("nm (binutils) is needed");
    let out = Command::new(nm)
        .args(["-D", "--defined-only"])
        .arg(cdylib())
        .output()
        .expect("nm");
    assert!(out.status.success(), "nm failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, kind, name) = (f.next()?, f.next()?, f.next()?);
            // Functions (T) and data (D, B, R) of this library.
            "TDBR".contains(kind).then(|| name.to_string())
        })
        .collect()
}

#[test]
fn every_entry_point_is_exported() {
    let syms = exported();
    let mut missing = Vec::new();
    for name in EXPORTS {
        for n in [name.to_string(), format!("p{name}")] {
            if !syms.contains(&n) {
                missing.push(n);
            }
        }
    }
    for name in EXPORTS_ONLY {
        if !syms.contains(&name.to_string()) {
            missing.push(name.to_string());
        }
    }
    assert!(missing.is_empty(), "not exported: {missing:?}");
}
