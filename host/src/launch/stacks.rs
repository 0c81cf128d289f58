//! Every thread's stack of a hung rank, read with `gdb` just before the launcher kills it
//! ([`LocalLauncher::stacks`](super::LocalLauncher::stacks)).
//!
//! A rank killed at the launch timeout is a hang, and a hang that happens once in many runs
//! (a CI machine under load) is gone by the time anyone looks: the thread names and kernel
//! wait channels ([`thread_states`](super::thread_states)) say that a thread sleeps, not in
//! which of our functions. `gdb` in batch mode attaches, prints every thread's backtrace and
//! detaches; the frames are cut down to the ones that locate the hang (ours, with file and
//! line), so the report stays readable.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// At most this many lines per process.
const MAX_LINES: usize = 400;

/// Crates whose frames are left out even where their debug information names a relative
/// path (a registry crate's may read `src/runtime/...`): the standard library's, the test
/// harness's and our dependencies' that run threads.
const THEIRS: [&str; 9] = [
    "std",
    "core",
    "alloc",
    "test",
    "tokio",
    "mio",
    "cudarc",
    "crossbeam_channel",
    "rayon",
];

/// Whether `MSCCLPP_LAUNCH_STACKS` ([`Settings::launch_stacks`]) turns stacks on for every
/// launcher that does not say otherwise (`.ci/run` sets it).
///
/// [`Settings::launch_stacks`]: crate::settings::Settings::launch_stacks
pub(super) fn wanted_by_env() -> bool {
    crate::settings::Settings::global_or_default().launch_stacks
}

/// The threads' stacks of process `pid` (see the [module](self)), from `gdb` given at most
/// `limit`; one line saying why there are none when `gdb` is missing, fails or runs out of
/// time.
pub(super) fn thread_stacks(pid: u32, limit: Duration) -> Vec<String> {
    let spawned = Command::new("gdb")
        .args(["-p", &pid.to_string(), "-batch", "-nx", "-q"])
        // Lowest thread ids first (the main thread, then the oldest), at most 40 frames each:
        // a slow gdb on a loaded machine that runs out of time still reports those.
        .args(["-ex", "set pagination off"])
        .args(["-ex", "thread apply all -ascending bt 40"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut gdb = match spawned {
        Ok(g) => g,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return vec!["(no stacks: gdb is not on PATH)".into()];
        }
        Err(e) => return vec![format!("(no stacks: cannot start gdb: {e})")],
    };
    // Read on a thread: gdb can print more than a pipe holds before it exits.
    let mut out = gdb.stdout.take().expect("piped above");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = out.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let finished = loop {
        match gdb.try_wait() {
            Ok(Some(_)) => break true,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = gdb.kill();
                let _ = gdb.wait();
                break false;
            }
        }
    };
    let text = reader.join().unwrap_or_default();
    let mut lines = frames(&text);
    if !finished {
        lines.push(format!(
            "(gdb did not finish within {limit:?}: stacks cut short)"
        ));
    } else if lines.is_empty() {
        lines.push("(no stacks: gdb printed no thread; can it attach here?)".into());
    }
    lines
}

/// `gdb`'s `thread apply all bt` output cut down: one `thread "name" (LWP n)` line per
/// thread, then its innermost frame and every frame with a source location outside the
/// standard library (`/rustc/...`, `library/...` or rust-src's copy), the crates.io
/// registry and the C library, as `#n function at file:line` (arguments dropped); without
/// debug information, every frame of a Rust function outside [`THEIRS`], as `#n function`.
fn frames(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        if out.len() >= MAX_LINES {
            out.push(format!("(cut at {MAX_LINES} lines)"));
            break;
        }
        if let Some(rest) = line.strip_prefix("Thread ") {
            // `Thread 3 (Thread 0x7f.. (LWP 123) "name"):`
            let lwp = rest
                .split_once("(LWP ")
                .and_then(|(_, t)| t.split_once(')'))
                .map_or("?", |(n, _)| n);
            let name = rest.split('"').nth(1).unwrap_or("?");
            out.push(format!("thread \"{name}\" (LWP {lwp})"));
            continue;
        }
        let Some(rest) = line.strip_prefix('#') else {
            continue;
        };
        let Some((n, rest)) = rest.split_once(char::is_whitespace) else {
            continue;
        };
        let rest = rest.trim_start();
        // `0x... in function (args) at file:line`, or `function (args) at file:line`.
        let rest = match rest.split_once(" in ") {
            Some((addr, f)) if addr.starts_with("0x") => f,
            _ => rest,
        };
        let function = rest.split(" (").next().unwrap_or(rest);
        let location = rest.rsplit_once(" at ").map(|(_, l)| l);
        // A v0-mangled name carries its crate's hash: `std[96bb1fa33c82f88a]::...`.
        let crate_name = function
            .trim_start_matches('<')
            .split("::")
            .next()
            .unwrap_or("");
        let crate_name = crate_name.split('[').next().unwrap_or(crate_name);
        // Without debug information (a release build) a frame has no location: a Rust
        // path outside the crates above is ours.
        let ours = !THEIRS.contains(&crate_name)
            && match location {
                Some(l) => {
                    !(l.starts_with("/rustc/")
                        || l.starts_with("library/")
                        || l.contains("/rustlib/src/rust/library/")
                        || l.contains("/.cargo/registry/")
                        || l.starts_with("./")
                        || l.starts_with("../"))
                }
                None => function.contains("::"),
            };
        if n == "0" || ours {
            match location {
                Some(l) => out.push(format!("  #{n} {function} at {l}")),
                None => out.push(format!("  #{n} {function}")),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::frames;

    #[test]
    fn frames_keep_threads_the_innermost_frame_and_ours() {
        let gdb = r#"[New LWP 12]
Thread 2 (Thread 0x7f00 (LWP 12) "mscclpp-tcp-2-3"):
#0  0x00007f in __GI___poll (fds=0x1, nfds=1, timeout=5) at ../sysdeps/unix/sysv/linux/poll.c:29
#1  0x000055 in std::net::tcp::TcpStream::read (self=0x2) at /rustc/abc/library/std/src/net/tcp.rs:10
#1  0x000055 in std::sys::pal::unix::futex::futex_wait (futex=0x4) at library/std/src/sys/pal/unix/futex.rs:73
#1  0x000055 in std::sync::mpsc::Receiver::recv (self=0x5) at /root/.rustup/toolchains/n/lib/rustlib/src/rust/library/std/src/sync/mpsc.rs:873
#2  0x000055 in mscclpp_host::transport::tcp::read_full (stream=0x3, idle=true) at host/src/transport/tcp.rs:405
#3  0x000055 in tokio::runtime::park (x=1) at /root/.cargo/registry/src/index/tokio-1/src/park.rs:7
#3  0x000055 in tokio::runtime::io::driver::Driver::turn (self=0x8) at src/runtime/io/driver.rs:199
#3  0x000055 in <tokio::runtime::blocking::task::BlockingTask<T> as core::future::future::Future>::poll (self=0x9) at src/runtime/blocking/task.rs:42
#4  0x000055 in ?? ()

Thread 1 (Thread 0x7f01 (LWP 11) "cross_host_two_"):
#0  mscclpp_device::packet::LlPacket::read (p=0x7, flag=644) at device/src/packet.rs:188
"#;
        assert_eq!(
            frames(gdb),
            [
                "thread \"mscclpp-tcp-2-3\" (LWP 12)",
                "  #0 __GI___poll at ../sysdeps/unix/sysv/linux/poll.c:29",
                "  #2 mscclpp_host::transport::tcp::read_full at host/src/transport/tcp.rs:405",
                "thread \"cross_host_two_\" (LWP 11)",
                "  #0 mscclpp_device::packet::LlPacket::read at device/src/packet.rs:188",
            ]
        );
    }

    /// A release build's frames have no file and line: ours are kept by their Rust path,
    /// the standard library's, the dependencies' and the C library's left out.
    #[test]
    fn frames_without_debug_information_keep_ours_by_name() {
        let gdb = r#"Thread 3 (Thread 0x7f02 (LWP 13) "hung-worker"):
#0  0x00007f in syscall () from /lib/x86_64-linux-gnu/libc.so.6
#1  0x000055 in std::sys::pal::unix::futex::futex_wait ()
#2  0x000055 in std::sync::mpsc::Receiver<T>::recv ()
#3  0x000055 in bootstrap_process::hang_here ()
#4  0x000055 in <alloc::boxed::Box<F,A> as core::ops::function::FnOnce<Args>>::call_once ()
#5  0x000055 in tokio::runtime::park ()
#5  0x000055 in <std[96bb1fa33c82f88a]::thread::thread::Thread>::park ()
#5  0x000055 in std[96bb1fa33c82f88a]::sys::backtrace::__rust_begin_short_backtrace::<bootstrap_process[ec04f17e261eb205]::hang::{closure#0}, ()> ()
#5  0x000055 in mscclpp_host[0123456789abcdef]::bootstrap::wait ()
#6  0x00007f in start_thread () from /lib/x86_64-linux-gnu/libc.so.6
#7  0x00007f in clone3 ()
"#;
        assert_eq!(
            frames(gdb),
            [
                "thread \"hung-worker\" (LWP 13)",
                "  #0 syscall",
                "  #3 bootstrap_process::hang_here",
                "  #5 mscclpp_host[0123456789abcdef]::bootstrap::wait",
            ]
        );
    }

    #[test]
    fn frames_of_no_output_are_none() {
        assert!(frames("ptrace: Operation not permitted.\n").is_empty());
    }
}
