//! A `/dev/shm` too small for the ranks' segments fails the set-up with an error on every
//! rank that names `/dev/shm`, its size and how to raise it; never a `SIGBUS` at the first
//! touch of a page beyond the space left (a 64 MiB `/dev/shm` is a container's default).
//!
//! The test binary re-executes itself in a private mount namespace (`unshare -m`, as root)
//! with a small tmpfs on `/dev/shm`, and there starts two ranks on the Host transport. Where
//! no such namespace can be made (not root, no `unshare`), it says why and checks nothing.

use mscclpp::host::collectives::Exec;
use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::create_unique_id;
use mscclpp::host::collectives::{CollConfig, Collectives, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::{ENV_BOOTSTRAP, ENV_LOCAL_RANK, ENV_NRANKS, ENV_RANK, Launch};

/// `namespace` in the process that mounted the small `/dev/shm`, `rank` in its ranks.
const ROLE: &str = "MSCCLPP_SHM_SPACE_ROLE";
/// The collectives' scratch of each rank, in bytes.
const SCRATCH: &str = "MSCCLPP_SHM_SPACE_SCRATCH";
/// Size of the tmpfs mounted on `/dev/shm` in the namespace.
const SHM_SIZE: &str = "4M";
/// The test that runs in the namespace (this one re-executed).
const TEST: &str = "a_full_dev_shm_fails_the_set_up_on_every_rank_with_how_to_raise_it";

/// Runs `command` for at most `limit` (killed then), returning how it ended and its
/// standard output and error (read as it runs, so that a full pipe cannot stall it).
fn run_for(command: &mut Command, limit: Duration) -> (std::process::ExitStatus, String, String) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let out = read(Box::new(child.stdout.take().unwrap()));
    let err = read(Box::new(child.stderr.take().unwrap()));
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, out.join().unwrap(), err.join().unwrap())
}

/// Whether this process can make a private mount namespace and mount a tmpfs in it; else
/// why not.
fn mount_namespace_available() -> Result<(), String> {
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs -o size=1M tmpfs /dev/shm"])
        .output()
        .map_err(|e| format!("`unshare` cannot run: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`unshare -m` with a tmpfs on /dev/shm failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// One rank: sets up its collectives with the scratch it was told, then makes a call that
/// touches all of it. Prints `error: ...` for an error; a signal ends the process.
fn rank_main() {
    let scratch: usize = std::env::var(SCRATCH).unwrap().parse().unwrap();
    let launch = Launch::from_env().unwrap();
    let bootstrap = launch.blocking_bootstrap().unwrap();
    let config = CommConfig {
        device_timeout: Duration::from_secs(5),
        ..CommConfig::default()
    };
    let result = Communicator::from_bootstrap(bootstrap, Backend::Host, config).and_then(|comm| {
        let coll = CollConfig {
            scratch_bytes: scratch,
            packet_max_bytes: 16 << 10,
            ..CollConfig::default()
        };
        let collectives = Collectives::new(comm, coll)?;
        let send = vec![1f32; scratch / 4];
        let mut recv = vec![0f32; scratch / 4];
        collectives.all_reduce(&send, &mut recv, ReduceOp::Sum, Exec::Host)
    });
    match result {
        Ok(()) => println!("\nok"),
        Err(e) => println!("\nerror: {e}"),
    }
}

/// In the namespace: two ranks with `scratch` bytes each; returns, per rank, how it ended
/// and what it printed.
fn run_ranks(scratch: usize) -> Vec<(std::process::ExitStatus, String)> {
    let exe = std::env::current_exe().unwrap();
    let id = create_unique_id().unwrap().to_string();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let mut command = Command::new(&exe);
            command
                .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
                .env(ROLE, "rank")
                .env(SCRATCH, scratch.to_string())
                .env(ENV_RANK, r.to_string())
                .env(ENV_NRANKS, "2")
                .env(ENV_LOCAL_RANK, r.to_string())
                .env(ENV_BOOTSTRAP, &id);
            std::thread::spawn(move || run_for(&mut command, Duration::from_secs(30)))
        })
        .collect();
    ranks
        .into_iter()
        .map(|rank| {
            let (status, out, err) = rank.join().unwrap();
            (status, format!("{out}{err}"))
        })
        .collect()
}

/// In the namespace: scratch too large for `/dev/shm` on each rank alone (8 MiB each), and
/// only together (3 MiB each: the first rank to reserve fits, the other does not, and the
/// first learns why its peer left).
fn namespace_main() {
    let mut failures = Vec::new();
    for scratch in [8 << 20, 3 << 20] {
        let started = Instant::now();
        let ranks = run_ranks(scratch);
        for (rank, (status, out)) in ranks.iter().enumerate() {
            let what = format!("scratch {scratch}, rank {rank} ({status}): {out}");
            if let Some(signal) = status.signal() {
                failures.push(format!("{what}: killed by signal {signal}"));
                continue;
            }
            let error = out.lines().find(|l| l.starts_with("error: "));
            let Some(error) = error else {
                failures.push(format!("{what}: no error"));
                continue;
            };
            for says in [
                "/dev/shm",
                SHM_SIZE.replace('M', ".0 MiB").as_str(),
                "--shm-size",
            ] {
                if !error.contains(says) {
                    failures.push(format!("{what}: the error does not say {says:?}"));
                }
            }
        }
        if started.elapsed() > Duration::from_secs(20) {
            failures.push(format!("scratch {scratch}: took {:?}", started.elapsed()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_full_dev_shm_fails_the_set_up_on_every_rank_with_how_to_raise_it() {
    match std::env::var(ROLE).as_deref() {
        Ok("rank") => return rank_main(),
        Ok(_) => return namespace_main(),
        Err(_) => {}
    }
    if let Err(why) = mount_namespace_available() {
        println!("skipped: no private /dev/shm can be mounted here: {why}");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let script = format!("mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm && exec \"$0\" \"$@\"");
    let (status, out, err) = run_for(
        Command::new("unshare")
            .args(["-m", "sh", "-c", &script])
            .arg(exe)
            .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
            .env(ROLE, "namespace"),
        Duration::from_secs(90),
    );
    assert!(status.success(), "{status}\n{out}\n{err}");
    println!("{out}");
}
