//! Which interface the TCP transport and a bootstrap root listen on (`MSCCLPP_SOCKET_IFNAME`,
//! else `NCCL_SOCKET_IFNAME`, as NCCL's).

use super::*;

/// The interfaces of this machine with their addresses (IPv4 first, then IPv6; no
/// link-local IPv6, which would need a scope).
pub(super) fn interfaces() -> io::Result<Vec<(String, IpAddr)>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes the head of a list that we free below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, not freed yet.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null name is a NUL-terminated string of the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: a non-null address starts with its family; the casts below follow it.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        if family == libc::AF_INET {
            // SAFETY: AF_INET addresses are sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            v4.push((name, IpAddr::V4(ip)));
        } else if family == libc::AF_INET6 {
            // SAFETY: AF_INET6 addresses are sockaddr_in6.
            let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
            let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            if !ip.is_unicast_link_local() {
                v6.push((name, IpAddr::V6(ip)));
            }
        }
    }
    // SAFETY: `head` came from getifaddrs and nothing of it is used after this.
    unsafe { libc::freeifaddrs(head) };
    v4.extend(v6);
    Ok(v4)
}

/// Whether interface `name` matches an `NCCL_SOCKET_IFNAME`-style `spec`.
pub(super) fn ifname_matches(spec: &str, name: &str) -> bool {
    let (exclude, spec) = match spec.strip_prefix('^') {
        Some(s) => (true, s),
        None => (false, spec),
    };
    let (exact, spec) = match spec.strip_prefix('=') {
        Some(s) => (true, s),
        None => (false, spec),
    };
    let hit = spec
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                name == p
            } else {
                name.starts_with(p)
            }
        });
    hit != exclude
}

/// The interface setting: `MSCCLPP_SOCKET_IFNAME`, else `NCCL_SOCKET_IFNAME` (blank values
/// count as unset), with the variable's name.
pub(super) fn ifname_spec() -> Result<Option<(&'static str, String)>, TcpError> {
    let s = Settings::global().map_err(|e| TcpError::Config(e.to_string()))?;
    Ok([
        (SOCKET_IFNAME_ENV, &s.socket_ifname),
        (NCCL_SOCKET_IFNAME_ENV, &s.nccl_socket_ifname),
    ]
    .into_iter()
    .find_map(|(var, v)| v.clone().map(|v| (var, v))))
}

/// This machine's interfaces, or a [`TcpError::NoInterface`] for `var`/`spec` that says why
/// they could not be listed.
pub(super) fn interfaces_for(
    var: &'static str,
    spec: &str,
) -> Result<Vec<(String, IpAddr)>, TcpError> {
    interfaces().map_err(|e| TcpError::NoInterface {
        var,
        spec: spec.to_string(),
        found: format!("cannot list them: {e}"),
    })
}

/// The first address of an interface of `found` that matches `spec`, or the error naming
/// `var`, `spec` and every interface.
pub(super) fn matching_ip(
    var: &'static str,
    spec: &str,
    found: &[(String, IpAddr)],
) -> Result<IpAddr, TcpError> {
    found
        .iter()
        .find(|(name, _)| ifname_matches(spec, name))
        .map(|(_, ip)| *ip)
        .ok_or_else(|| TcpError::NoInterface {
            var,
            spec: spec.to_string(),
            found: found
                .iter()
                .map(|(n, ip)| format!("{n} {ip}"))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// The address to listen on: the first address of an interface matching
/// `MSCCLPP_SOCKET_IFNAME` (else `NCCL_SOCKET_IFNAME`), else `default` (the bootstrap's).
pub fn listen_ip(default: IpAddr) -> Result<IpAddr, TcpError> {
    let Some((var, spec)) = ifname_spec()? else {
        return Ok(default);
    };
    matching_ip(var, &spec, &interfaces_for(var, &spec)?)
}

/// The address a bootstrap root created without an address (the NCCL library's
/// `ncclGetUniqueId`) listens on, so that ranks on other machines can reach it: an
/// interface matching `MSCCLPP_SOCKET_IFNAME` (else `NCCL_SOCKET_IFNAME`); unset, NCCL's
/// own order: an `ib*` interface, else any but `docker*` and `lo*`, else `docker*`, else
/// loopback (IPv4 before IPv6 in each).
pub fn root_ip() -> Result<IpAddr, TcpError> {
    match ifname_spec()? {
        Some((var, spec)) => matching_ip(var, &spec, &interfaces_for(var, &spec)?),
        None => Ok(default_root_ip(&interfaces().unwrap_or_default())),
    }
}

/// [`root_ip`]'s choice among `found` (in [`interfaces`]' order) when no interface is named;
/// 127.0.0.1 when none fits.
pub(super) fn default_root_ip(found: &[(String, IpAddr)]) -> IpAddr {
    ["ib", "^docker,lo", "docker", "lo"]
        .into_iter()
        .find_map(|spec| {
            found
                .iter()
                .find(|(name, ip)| ifname_matches(spec, name) && !ip.is_unspecified())
                .map(|(_, ip)| *ip)
        })
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}
