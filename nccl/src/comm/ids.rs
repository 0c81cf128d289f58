//! Where a communicator's bootstrap finds its root: unique ids, `NCCL_COMM_ID`, the
//! bootstrap settings of this library, and the colour/key messages of a split.

use super::*;

/// How long a communicator's rendezvous waits for its last rank when
/// `MSCCLPP_RENDEZVOUS_TIMEOUT` is not set: NCCL waits for ever, and programs call
/// `ncclCommInitRank` far apart (PyTorch creates a communicator at its first collective on
/// each group, and a rank may first download data or load a checkpoint), so the 30 s of the
/// other bootstrap waits would fail jobs NCCL runs. 30 minutes is PyTorch's default timeout
/// for its other backends (10 for NCCL); a rank that never comes is named when it passes.
pub const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The bootstrap settings of this library's communicators: `MSCCLPP_BOOTSTRAP_TIMEOUT` and
/// `MSCCLPP_RENDEZVOUS_TIMEOUT` (seconds) where set, else 30 s and [`RENDEZVOUS_TIMEOUT`];
/// a bad value is an invalid-argument error naming the variable.
pub fn bootstrap_config(call: &str) -> Result<BootstrapConfig, Failure> {
    Ok(bootstrap_config_of(settings_of(call)?))
}

/// This process's settings, or an invalid-argument failure of `call` naming the variables
/// that do not parse.
pub fn settings_of(call: &str) -> Result<&'static Settings, Failure> {
    Settings::global().map_err(|e| Failure::arg(format!("{call}: {e}")))
}

/// [`bootstrap_config`] of `settings`.
pub(super) fn bootstrap_config_of(settings: &Settings) -> BootstrapConfig {
    let config = mscclpp_host::launch::bootstrap_config_from(settings);
    match config.rendezvous_timeout {
        Some(_) => config,
        None => config.with_rendezvous_timeout(RENDEZVOUS_TIMEOUT),
    }
}

/// A fresh bootstrap id. Its root runs in this process and listens where ranks on other
/// machines can reach it, as NCCL's does: on the interface `MSCCLPP_SOCKET_IFNAME` or
/// `NCCL_SOCKET_IFNAME` names, else on NCCL's default choice
/// ([`mscclpp_host::transport::tcp::root_ip`]: `ib*`, then any but `docker*`/`lo*`, ...).
pub fn new_id(call: &str) -> Result<UniqueId, Failure> {
    let ip = root_ip().map_err(|e| {
        Failure::new(
            result::SYSTEM_ERROR,
            format!("{call}: where the bootstrap root should listen: {e}"),
        )
    })?;
    let id = create_unique_id_at(SocketAddr::new(ip, 0), bootstrap_config(call)?).map_err(|e| {
        Failure::new(
            result::SYSTEM_ERROR,
            format!("{call}: bootstrap root on {ip}: {e}"),
        )
    })?;
    log::info(&format!(
        "{call}: bootstrap root listening on {}",
        id.root_addr()
    ));
    Ok(id)
}

/// NCCL's variable for a fixed root address (`ip:port`, `[ipv6]:port` or `host:port`):
/// `ncclGetUniqueId` then starts no root and returns an id every rank can compute alike, and
/// rank 0 of a communicator made from that id hosts the root, as with NCCL; ours listens on
/// the port after the one named, which the real NCCL's root (when one is loaded beside ours)
/// takes itself.
pub const COMM_ID_ENV: &str = "NCCL_COMM_ID";

/// The id of the fixed root address `value` (`NCCL_COMM_ID`'s forms; our root on the next
/// port): the bootstrap's `"ip:port"` form under `config`
/// ([`BootstrapConfig::address_id`]: its secret, else `MSCCLPP_BOOTSTRAP_SECRET`).
pub fn comm_id_from(
    call: &str,
    value: &str,
    config: &BootstrapConfig,
) -> Result<UniqueId, Failure> {
    use std::net::ToSocketAddrs;
    let bad = |why: String| {
        Failure::arg(format!(
            "{call}: {COMM_ID_ENV}={value:?}: {why} (expected ip:port, [ipv6]:port or host:port)"
        ))
    };
    let mut addr = value
        .trim()
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?
        .next()
        .ok_or_else(|| bad("names no address".into()))?;
    if addr.port() == 0 {
        return Err(bad("port 0 names no port the ranks could reach".into()));
    }
    // The real NCCL, when loaded beside ours, hosts its own root on the port itself.
    let ours = addr
        .port()
        .checked_add(1)
        .ok_or_else(|| bad("our root takes the next port, and there is none after 65535".into()))?;
    addr.set_port(ours);
    Ok(config.address_id(addr))
}

/// The fixed-root id of the environment (`NCCL_COMM_ID`), if it is set, under `config`.
pub fn env_comm_id(call: &str, config: &BootstrapConfig) -> Result<Option<UniqueId>, Failure> {
    match &settings_of(call)?.nccl_comm_id {
        Some(v) => comm_id_from(call, v, config).map(Some),
        None => Ok(None),
    }
}

/// Where a communicator's bootstrap finds its root: when `id` is the fixed-root id
/// (`fixed`, from `NCCL_COMM_ID`), rank 0 hosts the root at its address (the bootstrap's
/// `"ip:port"` form, which derives the same id); else the root that made `id`.
pub fn bootstrap_root(id: UniqueId, fixed: Option<UniqueId>) -> BootstrapRoot {
    match fixed {
        Some(f) if f == id => BootstrapRoot::Addr(id.root_addr()),
        _ => BootstrapRoot::Id(id),
    }
}

/// Reads our id from the bytes of an `ncclUniqueId`.
pub fn parse_id(call: &str, bytes: &[u8]) -> Result<UniqueId, Failure> {
    UniqueId::from_bytes(bytes).map_err(|e| {
        Failure::arg(format!(
            "{call}: the ncclUniqueId was not made by this library's ncclGetUniqueId ({e}); \
             every rank must load the same library"
        ))
    })
}

/// Everything every rank sends in a split: color and key.
pub fn encode_color_key(color: c_int, key: c_int) -> Vec<u8> {
    let mut v = color.to_le_bytes().to_vec();
    v.extend_from_slice(&key.to_le_bytes());
    v
}

/// The inverse of [`encode_color_key`].
pub fn decode_color_key(b: &[u8]) -> Option<(c_int, c_int)> {
    if b.len() != 8 {
        return None;
    }
    let c = c_int::from_le_bytes(b[0..4].try_into().ok()?);
    let k = c_int::from_le_bytes(b[4..8].try_into().ok()?);
    Some((c, k))
}
