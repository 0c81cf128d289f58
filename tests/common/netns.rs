//! Network namespaces as hosts: `n` namespaces, each joined to a bridge in a switch
//! namespace of its own by a veth pair (optionally rate-limited with `tc tbf`), addressed
//! `10.<net>.0.<h + 1>/24`. The ranks of host `h` run inside namespace `h` (through
//! `ip netns exec`), and rank 0 hosts the bootstrap root at its namespace address, so every
//! byte between hosts crosses a veth link. Everything is removed when the value drops, also
//! when a test panics. Making namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN): where
//! it fails, [`Hosts::new`] says why and the tests skip.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// Namespaces standing in for hosts; removed on drop.
#[derive(Debug)]
pub struct Hosts {
    prefix: String,
    hosts: usize,
    net: u8,
}

/// Runs `ip args`, or returns its error text.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    ))
}

/// An `ip -batch` process inside a namespace, started ahead of the link commands a rank runs
/// mid-test ([`Hosts::link_args`], [`Hosts::remove_args`]). `ip -n` enters a namespace
/// with a mount namespace of its own, and its unmount of `/sys` waited 1-6 s for the
/// kernel (`synchronize_rcu_expedited`) on a busy 2-vCPU VM, so a 0.5 s link flap lasted
/// seconds; started ahead, each command is a netlink request of milliseconds.
pub struct LinkControl {
    child: Child,
    input: Option<ChildStdin>,
    /// `ip`'s output lines, read by a thread of their own (so a wait for one has a
    /// deadline); closed when `ip` ends.
    lines: Receiver<String>,
}

/// How long one command of a [`LinkControl`] may take before `ip` is killed and the command
/// fails (a netlink request takes milliseconds).
const LINK_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

impl LinkControl {
    /// Starts `ip` in the namespace that `args` name (`-n <namespace> ...`), and waits
    /// until it answers.
    pub fn start(args: &[String]) -> Result<LinkControl, String> {
        let ns = match args {
            [n, ns, ..] if n == "-n" => ns,
            _ => return Err(format!("no `-n <namespace>` in {args:?}")),
        };
        let mut child = Command::new("ip")
            .args(["-n", ns, "-oneline", "-batch", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("ip -n {ns} -batch: {e}"))?;
        let input = child.stdin.take();
        let output = BufReader::new(child.stdout.take().expect("piped"));
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in output.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut control = LinkControl {
            child,
            input,
            lines,
        };
        control.run(&[])?;
        Ok(control)
    }

    /// Runs the command of `args` (`-n <namespace>` and the `ip` command after it; empty:
    /// none) and returns once `ip` has done it, or with its error.
    pub fn run(&mut self, args: &[String]) -> Result<(), String> {
        let command = match args {
            [n, _, rest @ ..] if n == "-n" => rest,
            _ => args,
        };
        // `ip` answers the show only after the command before it: its line says it is done.
        let mut text = String::new();
        if !command.is_empty() {
            text = command.join(" ") + "\n";
        }
        text += "link show dev lo\n";
        let input = self.input.as_mut().expect("open until drop");
        input
            .write_all(text.as_bytes())
            .and_then(|()| input.flush())
            .map_err(|e| format!("ip {}: {e}", command.join(" ")))?;
        let deadline = Instant::now() + LINK_COMMAND_TIMEOUT;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) if line.contains(": lo:") => return Ok(()),
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return Err(format!(
                        "ip {}: no answer within {LINK_COMMAND_TIMEOUT:?} (killed)",
                        command.join(" ")
                    ));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    // `ip -batch` stops at a failed command: its reason is on stderr.
                    let mut why = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        let _ = e.read_to_string(&mut why);
                    }
                    return Err(format!("ip {}: {}", command.join(" "), why.trim()));
                }
            }
        }
    }
}

impl Drop for LinkControl {
    fn drop(&mut self) {
        // End of input ends `ip`.
        drop(self.input.take());
        let _ = self.child.wait();
    }
}

/// Runs `cmd args` inside namespace `ns`, or returns its error text.
fn ns_run(ns: &str, cmd: &str, args: &[&str]) -> Result<(), String> {
    let mut all = vec!["netns", "exec", ns, cmd];
    all.extend_from_slice(args);
    ip(&all)
}

impl Hosts {
    /// Makes `hosts` namespaces on a bridge; each link limited to `rate` (a `tc` rate such
    /// as `"1gbit"`) when given. `Err` says why they could not be made (the caller skips).
    pub fn new(hosts: usize, rate: Option<&str>) -> Result<Hosts, String> {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let pid = std::process::id();
        let k = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Interface names are at most 15 bytes: `m` + pid + `x` + the test's number + `s`/`h`
        // + host.
        let tag = format!("m{}x{k}", pid % 10_000_000);
        let net = 64 + (pid % 128) as u8;
        let made = Hosts {
            prefix: tag.clone(),
            hosts,
            net,
        };
        ip(&["netns", "add", &made.switch()])?;
        for h in 0..hosts {
            ip(&["netns", "add", &made.name(h)])?;
        }
        let sw = made.switch();
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &sw, "link", "set", "br0", "up"])?;
        for h in 0..hosts {
            let (outer, inner) = (format!("{tag}s{h}"), format!("{tag}h{h}"));
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ])?;
            ip(&["link", "set", &outer, "netns", &sw])?;
            ip(&["link", "set", &inner, "netns", &made.name(h)])?;
            ip(&["-n", &sw, "link", "set", &outer, "master", "br0"])?;
            ip(&["-n", &sw, "link", "set", &outer, "up"])?;
            let ns = made.name(h);
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", made.addr(h)),
                "dev",
                &inner,
            ])?;
            ip(&["-n", &ns, "link", "set", &inner, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            if let Some(rate) = rate {
                let args = [
                    "qdisc", "add", "dev", &inner, "root", "tbf", "rate", rate, "burst", "256kb",
                    "latency", "50ms",
                ];
                ns_run(&ns, "tc", &args)?;
            }
        }
        Ok(made)
    }

    /// Namespace of host `h`.
    pub fn name(&self, h: usize) -> String {
        format!("{}-host{h}", self.prefix)
    }

    /// The switch's namespace.
    fn switch(&self) -> String {
        format!("{}-switch", self.prefix)
    }

    /// Host `h`'s address.
    pub fn addr(&self, h: usize) -> String {
        format!("10.{}.0.{}", self.net, h + 1)
    }

    /// The `ip` arguments that set host `h`'s link down (`false`) or up, for a rank to run
    /// mid-test ([`link`] runs them).
    pub fn link_args(&self, h: usize, up: bool) -> Vec<String> {
        let state = if up { "up" } else { "down" };
        let dev = format!("{}s{h}", self.prefix);
        ["-n", &self.switch(), "link", "set", &dev, state]
            .map(String::from)
            .to_vec()
    }

    /// The `ip` arguments that remove host `h`'s link from the switch (its end in the host's
    /// namespace goes with it, as when the namespace itself is deleted): the host is gone
    /// from the network for good.
    pub fn remove_args(&self, h: usize) -> Vec<String> {
        let dev = format!("{}s{h}", self.prefix);
        ["-n", &self.switch(), "link", "del", &dev]
            .map(String::from)
            .to_vec()
    }

    /// The arguments of `sh` that run `exe args` as a rank inside the namespace of its host
    /// (`rank % hosts`, from `MSCCLPP_RANK`: the layout `cyclic:<hosts>`), with the bootstrap
    /// root at rank 0's address and `port` (replacing the launcher's loopback root).
    pub fn wrap(&self, port: u16, exe: &str, args: &[&str]) -> Vec<String> {
        let script = format!(
            "h=$((MSCCLPP_RANK % {})); \
             exec ip netns exec {}-host$h env MSCCLPP_BOOTSTRAP={}:{port} \"$0\" \"$@\"",
            self.hosts,
            self.prefix,
            self.addr(0)
        );
        let mut all = vec!["-c".to_string(), script, exe.to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth ends in it, and with them their peers.
        for h in 0..self.hosts {
            let _ = ip(&["netns", "del", &self.name(h)]);
        }
        let _ = ip(&["netns", "del", &self.switch()]);
    }
}
