//! Diagnostic lines on stderr that stay whole when several processes share it.
//!
//! `eprintln!` writes its format's pieces one `write(2)` at a time (stderr is unbuffered), so
//! the ranks of a job that share one stderr (torchrun, mpirun, a shell redirect) interleave
//! them mid-line: `[mscclpp-nccl pid 20724[mscclpp-nccl pid ] INFO 20723rank 1/2: …`. A line
//! written here is built first and written with one call, which the kernel does not split
//! for a regular file or for a pipe up to `PIPE_BUF` (4 KiB) bytes.

use std::io::Write;

/// Writes `line` and a newline to stderr in one write; errors are ignored, as `eprintln!`
/// would panic on them and a diagnostic must never take the process down.
pub fn eprint_line(line: &str) {
    let mut buf = String::with_capacity(line.len() + 1);
    buf.push_str(line);
    buf.push('\n');
    let _ = std::io::stderr().lock().write_all(buf.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    /// Set in the children of the test below: write lines instead of checking them.
    const CHILD_ENV: &str = "MSCCLPP_DIAG_TEST_CHILD";
    const LINES: usize = 20_000;

    /// Two processes sharing one stderr file (as torchrun's ranks do) each write
    /// `LINES` lines built from several pieces; every line must come out whole. With the
    /// pieces written one by one (`eprintln!("[{tag} pid {}] INFO {msg}", ..)`), lines are
    /// split between the processes.
    #[test]
    fn lines_of_two_processes_sharing_stderr_stay_whole() {
        if let Ok(child) = std::env::var(CHILD_ENV) {
            // "TAG START_MS": both writers start at the same wall-clock millisecond, so
            // that their writes overlap.
            let (tag, start) = child.split_once(' ').unwrap();
            let start = UNIX_EPOCH + Duration::from_millis(start.parse().unwrap());
            while SystemTime::now() < start {
                std::hint::spin_loop();
            }
            let pid = std::process::id();
            for i in 0..LINES {
                eprint_line(&format!("[diag-{tag} pid {pid}] INFO line {i} of {LINES}"));
            }
            std::process::exit(0);
        }
        let dir = std::env::temp_dir().join(format!("mscclpp-diag-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("stderr.txt");
        let file = std::fs::File::create(&path).unwrap();
        let exe = std::env::current_exe().unwrap();
        let start =
            SystemTime::now().duration_since(UNIX_EPOCH).unwrap() + Duration::from_millis(300);
        let children: Vec<_> = ["a", "b"]
            .iter()
            .map(|tag| {
                Command::new(&exe)
                    .args([
                        "--exact",
                        "diag::tests::lines_of_two_processes_sharing_stderr_stay_whole",
                        "--test-threads=1",
                        "--nocapture",
                    ])
                    .env(CHILD_ENV, format!("{tag} {}", start.as_millis()))
                    .stdout(Stdio::null())
                    .stderr(Stdio::from(file.try_clone().unwrap()))
                    .spawn()
                    .unwrap()
            })
            .collect();
        for mut c in children {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if let Some(status) = c.try_wait().unwrap() {
                    assert!(status.success(), "a writer failed: {status}");
                    break;
                }
                assert!(Instant::now() < deadline, "a writer did not finish in 60 s");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        let mut whole = [0usize; 2];
        let mut broken = Vec::new();
        for l in text
            .lines()
            .filter(|l| l.contains("diag-") || l.contains("INFO line"))
        {
            let ok = ["a", "b"].iter().position(|tag| {
                l.strip_prefix(&format!("[diag-{tag} pid "))
                    .and_then(|r| r.split_once("] INFO line "))
                    .is_some_and(|(pid, rest)| {
                        pid.parse::<u32>().is_ok()
                            && rest
                                .strip_suffix(&format!(" of {LINES}"))
                                .is_some_and(|i| i.parse::<usize>().is_ok())
                    })
            });
            match ok {
                Some(k) => whole[k] += 1,
                None => broken.push(l.to_string()),
            }
        }
        assert!(
            broken.is_empty(),
            "{} lines were split between the processes, e.g. {:?}",
            broken.len(),
            &broken[..broken.len().min(3)]
        );
        assert_eq!(whole, [LINES, LINES], "lines lost");
    }
}
