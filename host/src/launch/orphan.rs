//! Ranks that end with their launcher.

use std::process::Command;

/// Makes the child `cmd` starts receive SIGTERM when the launcher's thread that starts
/// it ends (Linux: `PR_SET_PDEATHSIG`), so that a launcher that is killed (or dies)
/// does not leave its ranks running as orphans until their next write to its pipe
/// fails; a child whose launcher is already gone when it starts exits at once.
/// [`LocalLauncher::run`](super::LocalLauncher::run) starts the ranks from the thread
/// that waits for them, so the signal comes only when the launcher is gone. Elsewhere:
/// nothing.
#[cfg(target_os = "linux")]
pub(super) fn die_with_launcher(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let launcher = std::process::id() as libc::pid_t;
    let hook = move || {
        // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number reads no memory; it is
        // async-signal-safe, as the child between fork and exec requires.
        if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: getppid takes nothing and is async-signal-safe.
        if unsafe { libc::getppid() } != launcher {
            // The launcher ended before the rank started (no allocation here: another
            // thread of the parent may have held the allocator's lock at the fork).
            return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
        }
        Ok(())
    };
    // SAFETY: the hook calls only async-signal-safe functions (prctl, getppid) and
    // allocates nothing (its errors are raw OS error codes).
    unsafe { cmd.pre_exec(hook) };
}

/// Elsewhere: nothing (see the Linux version).
#[cfg(not(target_os = "linux"))]
pub(super) fn die_with_launcher(_cmd: &mut Command) {}
