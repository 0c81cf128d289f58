//! How the bootstrap notices that the network between two ranks is gone: TCP keepalive and
//! a bound on unacknowledged data on every peer connection ([`watch`]), and the words for
//! such a loss ([`lost_detail`]).

use std::io::ErrorKind;
use std::time::Duration;

use tokio::net::TcpStream;

use crate::settings::Settings;

/// The link timeout in force: `MSCCLPP_LINK_TIMEOUT`, else `configured`; at least 2 s.
pub(crate) fn link_timeout(configured: Duration) -> Duration {
    let set = Settings::global_or_default().link_timeout;
    set.unwrap_or(configured).max(Duration::from_secs(2))
}

/// Makes `stream` fail with [`ErrorKind::TimedOut`] once its peer has not answered for about
/// `timeout`: keepalive probes after 1 s idle, then every second, `timeout - 1 s` of them
/// unanswered; data unacknowledged for `timeout`. Best effort: an option the system refuses
/// leaves the connection as it was.
pub(crate) fn watch(stream: &TcpStream, timeout: Duration) {
    use rustix::net::sockopt;
    let probes = (timeout.as_secs().saturating_sub(1)).clamp(1, 127) as u32;
    let second = Duration::from_secs(1);
    let _ = sockopt::set_socket_keepalive(stream, true);
    let _ = sockopt::set_tcp_keepidle(stream, second);
    let _ = sockopt::set_tcp_keepintvl(stream, second);
    let _ = sockopt::set_tcp_keepcnt(stream, probes);
    let ms = timeout.as_millis().min(u32::MAX as u128) as u32;
    let _ = sockopt::set_tcp_user_timeout(stream, ms);
}

/// Whether a socket error means that the network, not the peer, went away: its probes or
/// data went unanswered, or no route to it is left.
pub(crate) fn network_lost(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::TimedOut | ErrorKind::HostUnreachable | ErrorKind::NetworkUnreachable
    )
}

/// How [`lost_detail`] begins.
const NETWORK_LOST: &str = "the network connection between host ";

/// Whether a lost rank's detail says the network to it was lost (not that it died).
pub(crate) fn is_network_loss(detail: &str) -> bool {
    detail.starts_with(NETWORK_LOST)
}

/// The detail of a peer lost with the network between the two hosts. A peer of the same
/// host is reached at the host's own address, which goes when the host's network does (an
/// interface removed): that connection is "between host h and itself".
pub(crate) fn lost_detail(
    my_host: &str,
    peer_host: &str,
    peer_addr: std::net::SocketAddr,
    timeout: Duration,
    error: &dyn std::fmt::Display,
) -> String {
    let peer = if peer_host == my_host {
        "itself".to_string()
    } else {
        format!("host {peer_host}")
    };
    format!(
        "{NETWORK_LOST}{my_host} and {peer} ({}) was lost: no answer for {} s \
         (MSCCLPP_LINK_TIMEOUT; {error})",
        peer_addr.ip(),
        timeout.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_silence_and_missing_routes_are_network_losses() {
        assert!(network_lost(ErrorKind::TimedOut));
        assert!(network_lost(ErrorKind::HostUnreachable));
        assert!(!network_lost(ErrorKind::ConnectionReset));
        assert!(!network_lost(ErrorKind::UnexpectedEof));
    }

    #[test]
    fn the_timeout_is_at_least_two_seconds() {
        assert_eq!(link_timeout(Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(
            link_timeout(Duration::from_millis(300)),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn a_lost_link_names_both_hosts() {
        let addr = "10.64.0.2:4000".parse().unwrap();
        let d = lost_detail("h0", "h1", addr, Duration::from_secs(3), &"timed out");
        assert!(
            d.contains("between host h0 and host h1 (10.64.0.2)") && d.contains("3 s"),
            "{d}"
        );
        assert!(is_network_loss(&d));
        assert!(!is_network_loss("its connection closed without a goodbye"));
        let own = lost_detail("h1", "h1", addr, Duration::from_secs(3), &"unreachable");
        assert!(
            own.contains("between host h1 and itself (10.64.0.2)"),
            "{own}"
        );
    }
}
