//! One reader of `/proc/<pid>/stat` (Linux) for the code that asks about another process:
//! whether a peer's process has ended (shared-memory names left behind), what the
//! launcher's ranks are doing (their threads; whether one is stopped), and why a rank of
//! this machine is not making progress when a wait for some rank timed out.

/// The command name and state letter of a `stat` line (`pid (comm) state ...`): `R`
/// running, `S` sleeping, `D` uninterruptible, `T` stopped by a signal, `t` stopped by a
/// debugger, `Z` zombie, `X` dead. The name may hold spaces and parentheses, so the line is
/// split at its last `)`.
pub(crate) fn parse_stat(stat: &str) -> Option<(&str, &str)> {
    let (head, tail) = stat.rsplit_once(')')?;
    let name = head.split_once('(').map(|(_, n)| n)?;
    let state = tail.split_whitespace().next()?;
    Some((name, state))
}

/// What `/proc` says about a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ProcessState {
    /// No such process (it ended and was reaped).
    Gone,
    /// The state letter of its `stat` line (see [`parse_stat`]).
    State(String),
    /// It cannot be told (not Linux, `/proc` unreadable or in an unknown format).
    Unknown,
}

/// The state of process `pid` (its main thread's, which `/proc/<pid>/stat` reports).
pub(crate) fn process_state(pid: u32) -> ProcessState {
    if !cfg!(target_os = "linux") {
        return ProcessState::Unknown;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => match parse_stat(&stat) {
            Some((_, state)) => ProcessState::State(state.to_owned()),
            None => ProcessState::Unknown,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => ProcessState::Gone,
        Err(_) => ProcessState::Unknown,
    }
}

/// Whether process `pid` has ended (gone, or a zombie); `false` where that cannot be told.
pub(crate) fn process_gone(pid: u32) -> bool {
    match process_state(pid) {
        ProcessState::Gone => true,
        ProcessState::State(s) => s == "Z" || s == "X",
        ProcessState::Unknown => false,
    }
}

/// Whether process `pid` is stopped by a signal (`SIGSTOP`, `SIGTSTP`: state `T`). A
/// process stopped by a debugger (`t`) is not: someone is looking at it.
pub(crate) fn process_stopped(pid: u32) -> bool {
    matches!(process_state(pid), ProcessState::State(s) if s == "T")
}

/// Why process `pid` is not making progress, if `/proc` shows a reason now: stopped by a
/// signal (`T`) or by a debugger (`t`), in an uninterruptible wait in the kernel (`D`: a
/// snapshot of that moment, often brief, and said so), or ended (gone, a zombie, dead).
/// `None` while it runs or sleeps as usual, and where that cannot be told.
pub(crate) fn stuck_reason(pid: u32) -> Option<&'static str> {
    match process_state(pid) {
        ProcessState::Gone => Some("has ended"),
        ProcessState::State(s) => match s.as_str() {
            "T" => {
                Some("is stopped by a signal (SIGSTOP, or SIGTSTP as Ctrl-Z sends, until SIGCONT)")
            }
            "t" => Some("is stopped by a debugger"),
            "D" => Some(
                "was, when looked at, in an uninterruptible wait in the kernel (state D: a \
                 driver or file system call that had not returned)",
            ),
            "Z" => Some("has ended (a zombie: its parent has not reaped it)"),
            "X" => Some("has ended"),
            _ => None,
        },
        ProcessState::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_names_parse_at_the_last_parenthesis() {
        assert_eq!(parse_stat("42 (a) b) c) S 1 2 3"), Some(("a) b) c", "S")));
        assert_eq!(parse_stat("42 (x y) T 1"), Some(("x y", "T")));
        assert_eq!(parse_stat("42 x S 1"), None);
        assert_eq!(parse_stat("42 (x)"), None);
    }

    #[test]
    fn this_process_runs_and_a_reaped_child_is_gone() {
        if !cfg!(target_os = "linux") {
            eprintln!("skipped: /proc is Linux's");
            return;
        }
        // Running, sleeping or in a disk wait, as a loaded machine may show; not stopped,
        // not a zombie.
        assert!(matches!(
            process_state(std::process::id()),
            ProcessState::State(s) if !matches!(s.as_str(), "T" | "t" | "Z" | "X")
        ));
        assert!(!process_gone(std::process::id()));
        assert_eq!(stuck_reason(std::process::id()), None);
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert!(process_gone(pid));
        assert!(!process_stopped(pid));
        assert_eq!(stuck_reason(pid), Some("has ended"));
    }

    #[test]
    fn a_child_stopped_by_sigstop_reads_as_stopped_until_continued() {
        if !cfg!(target_os = "linux") {
            eprintln!("skipped: /proc is Linux's");
            return;
        }
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        let signal = |sig: &str| crate::testing::signal(pid, sig);
        let wait_for = |want: bool| {
            let start = std::time::Instant::now();
            while process_stopped(pid) != want {
                assert!(
                    start.elapsed() < std::time::Duration::from_secs(10),
                    "pid {pid} not {} after 10 s: {:?}",
                    if want { "stopped" } else { "running" },
                    process_state(pid)
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        };
        wait_for(false);
        // Once it sleeps (just started, it may still be in a disk wait, D, on a loaded
        // machine), nothing is wrong with it.
        let start = std::time::Instant::now();
        while stuck_reason(pid).is_some() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(10),
                "sleep(1) sleeps as usual: {:?}",
                stuck_reason(pid)
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        signal("-STOP");
        wait_for(true);
        assert!(
            stuck_reason(pid).is_some_and(|r| r.starts_with("is stopped by a signal")),
            "{:?}",
            stuck_reason(pid)
        );
        signal("-CONT");
        wait_for(false);
        let _ = child.kill();
        let _ = child.wait();
    }
}
