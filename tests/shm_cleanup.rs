//! Nothing is left in `/dev/shm` when a rank is killed (SIGKILL) at any point: before
//! setup, in the middle of `Collectives::new` (after it has sent its segments' names, before
//! its peer mapped them), between calls, during a call, and after it published a name its
//! peer was never sent (the peer removes a dead rank's names). The test binary re-executes
//! itself as two ranks per case, kills one at the chosen point, lets the other run into the
//! failure and exit, then looks for segments named after either process
//! (`/dev/shm/mscclpp-<pid>-...`: only these two processes make such names).

use mscclpp::host::collectives::Exec;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mscclpp::host::bootstrap::create_unique_id;
use mscclpp::host::collectives::{CollConfig, Collectives, ReduceOp};
use mscclpp::host::communicator::{Backend, CommConfig, Communicator};
use mscclpp::host::launch::{ENV_BOOTSTRAP, ENV_LOCAL_RANK, ENV_NRANKS, ENV_RANK, Launch};
use mscclpp::host::transport::shm::ShmSegment;

const ROLE: &str = "MSCCLPP_SHM_CLEANUP_ROLE";
const CASE: &str = "MSCCLPP_SHM_CLEANUP_CASE";
const VICTIM: &str = "MSCCLPP_SHM_CLEANUP_VICTIM";
/// What the victim prints when it has reached the point where it is to be killed.
const KILL_ME: &str = "shm-cleanup: kill me";

/// Where to kill the victim.
#[derive(Debug, Clone, Copy)]
enum Case {
    /// A communicator and a buffer, nothing shared yet.
    BeforeSetup,
    /// Inside `Collectives::new`, waiting for the peer's descriptions (its own are sent).
    InSetup,
    /// After a call, before the next.
    BetweenCalls,
    /// Inside calls.
    DuringCall,
    /// After publishing a segment's name that no peer was sent (as a rank killed between
    /// publishing its names and sending them in a setup round).
    NamePublished,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::BeforeSetup => "before_setup",
            Case::InSetup => "in_setup",
            Case::BetweenCalls => "between_calls",
            Case::DuringCall => "during_call",
            Case::NamePublished => "name_published",
        }
    }

    fn parse(s: &str) -> Case {
        [
            Case::BeforeSetup,
            Case::InSetup,
            Case::BetweenCalls,
            Case::DuringCall,
            Case::NamePublished,
        ]
        .into_iter()
        .find(|c| c.name() == s)
        .unwrap_or_else(|| panic!("unknown case {s}"))
    }
}

fn coll_config() -> CollConfig {
    CollConfig {
        scratch_bytes: 64 << 10,
        packet_max_bytes: 16 << 10,
        ..CollConfig::default()
    }
}

/// Blocks until the parent writes a line (or closes stdin).
fn wait_for_go() {
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn say(what: &str) {
    println!("{what}");
    let _ = std::io::stdout().flush();
}

/// One rank of a case. Errors after the victim is gone are expected; the rank just ends.
fn rank_main() {
    let case = Case::parse(&std::env::var(CASE).unwrap());
    let victim: usize = std::env::var(VICTIM).unwrap().parse().unwrap();
    let launch = Launch::from_env().unwrap();
    let bs = launch.blocking_bootstrap().unwrap();
    let me = bs.rank();
    let config = CommConfig {
        device_timeout: Duration::from_secs(3),
        ..CommConfig::default()
    };
    let comm = Communicator::from_bootstrap(bs, Backend::Host, config).unwrap();
    let is_victim = me == victim;
    let send = vec![1f32; 20_000];
    let mut recv = vec![0f32; 20_000];
    match case {
        Case::BeforeSetup => {
            let _buf = comm.alloc_buffer(10 << 10).unwrap();
            if is_victim {
                say(KILL_ME);
                wait_for_go();
                return;
            }
            wait_for_go();
            let r = Collectives::new(comm, coll_config());
            say(&format!("survivor: Collectives::new: {:?}", r.err()));
        }
        Case::InSetup => {
            if is_victim {
                say(KILL_ME);
                let _ = Collectives::new(comm, coll_config());
                wait_for_go();
                return;
            }
            wait_for_go();
            let r = Collectives::new(comm, coll_config());
            say(&format!("survivor: Collectives::new: {:?}", r.err()));
        }
        Case::BetweenCalls => {
            let c = Collectives::new(comm, coll_config()).unwrap();
            c.all_reduce(&send, &mut recv, ReduceOp::Sum, Exec::Host)
                .unwrap();
            if is_victim {
                say(KILL_ME);
                wait_for_go();
                return;
            }
            wait_for_go();
            let r = c.all_reduce(&send, &mut recv, ReduceOp::Sum, Exec::Host);
            say(&format!("survivor: all_reduce: {:?}", r.err()));
        }
        Case::NamePublished => {
            if is_victim {
                let seg = ShmSegment::create(1 << 20).unwrap();
                let _name = seg.publish().unwrap();
                say(KILL_ME);
                wait_for_go();
                return;
            }
            wait_for_go();
            let r = comm.bootstrap().barrier();
            say(&format!("survivor: barrier: {:?}", r.err()));
        }
        Case::DuringCall => {
            let c = Collectives::new(comm, coll_config()).unwrap();
            if is_victim {
                say(KILL_ME);
            }
            loop {
                if let Err(e) = c.all_reduce(&send, &mut recv, ReduceOp::Sum, Exec::Host) {
                    say(&format!("all_reduce: {e}"));
                    break;
                }
            }
        }
    }
}

struct Rank {
    child: Child,
    stdin: Option<ChildStdin>,
}

fn spawn_ranks(case: Case, victim: usize) -> (Vec<Rank>, mpsc::Receiver<(usize, String)>) {
    let exe = std::env::current_exe().unwrap();
    let id = create_unique_id().unwrap().to_string();
    let (tx, rx) = mpsc::channel();
    let ranks = (0..2)
        .map(|r| {
            let mut child = Command::new(&exe)
                .args(["--exact", "kill_rank", "--nocapture", "--test-threads=1"])
                .env(ROLE, "rank")
                .env(CASE, case.name())
                .env(VICTIM, victim.to_string())
                .env(ENV_RANK, r.to_string())
                .env(ENV_NRANKS, "2")
                .env(ENV_LOCAL_RANK, r.to_string())
                .env(ENV_BOOTSTRAP, &id)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let out = child.stdout.take().unwrap();
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send((r, line));
                }
            });
            let stdin = child.stdin.take();
            Rank { child, stdin }
        })
        .collect();
    (ranks, rx)
}

/// Waits at most `limit` for `child` to exit; kills it if it does not.
fn reap(child: &mut Child, limit: Duration) {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Segments named after `pid` in /dev/shm.
fn segments_of(pid: u32) -> Vec<String> {
    let prefix = format!("mscclpp-{pid}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs `case` with rank `victim` killed; returns the segments either process left.
fn run_case(case: Case, victim: usize) -> Vec<String> {
    let (mut ranks, rx) = spawn_ranks(case, victim);
    let pids: Vec<u32> = ranks.iter().map(|r| r.child.id()).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((r, line)) if r == victim && line.contains(KILL_ME) => break,
            Ok(_) => {}
            Err(_) => {
                for r in &mut ranks {
                    let _ = r.child.kill();
                    let _ = r.child.wait();
                }
                panic!("{}: the victim never reached its point", case.name());
            }
        }
    }
    // Let it get into the call (or the setup round) before the kill.
    std::thread::sleep(Duration::from_millis(500));
    let v = &mut ranks[victim];
    v.child.kill().unwrap();
    v.child.wait().unwrap();
    let s = &mut ranks[1 - victim];
    if let Some(mut stdin) = s.stdin.take() {
        let _ = writeln!(stdin, "go");
    }
    reap(&mut s.child, Duration::from_secs(60));
    let mut left = Vec::new();
    for pid in pids {
        for name in segments_of(pid) {
            // Clean up after a failure, so that the machine does not keep it.
            let _ = std::fs::remove_file(format!("/dev/shm/{name}"));
            left.push(name);
        }
    }
    left
}

/// A rank of the cases (runs only when the parent test starts it).
#[test]
fn kill_rank() {
    if std::env::var(ROLE).is_ok() {
        rank_main();
    }
}

#[test]
fn no_segment_is_left_when_a_rank_is_killed_at_any_point() {
    if std::env::var(ROLE).is_ok() {
        return;
    }
    if !std::path::Path::new("/dev/shm").is_dir() {
        eprintln!("skipping: no /dev/shm");
        return;
    }
    let mut failures = Vec::new();
    for case in [
        Case::BeforeSetup,
        Case::InSetup,
        Case::BetweenCalls,
        Case::DuringCall,
        Case::NamePublished,
    ] {
        for victim in [0, 1] {
            let left = run_case(case, victim);
            if !left.is_empty() {
                failures.push(format!(
                    "{} (rank {victim} killed): {} segment(s) left: {left:?}",
                    case.name(),
                    left.len()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
