//! Forwarding a rank's output, line by line, with a `[rank N] ` prefix.

use std::io::{BufRead, BufReader, Read, Write};

/// Prefixes one line of a rank's output.
pub(super) fn prefixed(rank: usize, line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    format!("[rank {rank}] {}", text.trim_end_matches(['\n', '\r']))
}

/// Forwards `pipe` of `rank` line by line from a thread of its own: printed (stderr lines to
/// stderr), or with `capture`, returned when the pipe closes; `prefix` adds `[rank N] `.
pub(super) fn forward(
    rank: usize,
    pipe: impl Read + Send + 'static,
    is_stderr: bool,
    prefix: bool,
    capture: bool,
) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        let mut captured = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return captured,
                Ok(_) => {
                    let text = if prefix {
                        prefixed(rank, &line)
                    } else {
                        String::from_utf8_lossy(&line)
                            .trim_end_matches(['\n', '\r'])
                            .to_string()
                    };
                    if capture {
                        captured.push(text);
                    } else if is_stderr {
                        // eprintln!/println! (not io::stdout) so the test harness captures it.
                        eprintln!("{text}");
                    } else {
                        println!("{text}");
                        let _ = std::io::stdout().flush();
                    }
                }
            }
        }
    })
}
