//! What this machine offers the library's threads: how many cores, and whether that is
//! few. The threads that hand work to each other (a proxy that spins for work, the TCP
//! writers) pay off only where they do not take the cores that the ranks' own threads and
//! the receivers need.

/// Machines with at most this many cores are "few cores" ([`few_cores`]).
pub(crate) const FEW_CORES: usize = 4;

/// The cores this process may run on (1 when the system does not say).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Whether this machine has at most [`FEW_CORES`] cores: there an idle proxy yields instead
/// of spinning, and a TCP put is written by the proxy's thread alone. Measured on the
/// 2-core CI machine (Host backend, two ranks as two hosts on loopback): 8 B all-reduce
/// took 420 us with spinning proxies and 13-40 us with yielding ones; parallel TCP writes
/// helped at 1-4 MB and cost at 16 MB.
pub(crate) fn few_cores() -> bool {
    cores() <= FEW_CORES
}
