//! Route discovery: which local address a node offers its peers when `--bind-ip` is not given.

use std::net::IpAddr;

/// The address to offer peers when `--bind-ip` is not given, and why: loopback for a
/// signaling server on loopback, else the local address of the route to the signaling server
/// (a connected UDP socket picks it; connecting sends nothing).
pub fn bind_ip_for(signal_url: &str) -> (IpAddr, String) {
    let loopback = IpAddr::from([127, 0, 0, 1]);
    let Some(server) = signal_address(signal_url) else {
        return (loopback, format!("cannot resolve the host of {signal_url}"));
    };
    if server.ip().is_loopback() {
        return (loopback, "the signaling server is on loopback".into());
    }
    let unspecified: std::net::SocketAddr =
        if server.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    match std::net::UdpSocket::bind(unspecified).and_then(|s| s.connect(server).and_then(|()| s.local_addr())) {
        Ok(local) => (local.ip(), format!("the interface that reaches {server}")),
        Err(e) => (loopback, format!("no route to {server}: {e}")),
    }
}

/// The signaling server's socket address from `ws://HOST:PORT/…` (port 80/443 by default).
fn signal_address(signal_url: &str) -> Option<std::net::SocketAddr> {
    use std::net::ToSocketAddrs;
    let (scheme, rest) = signal_url.split_once("://")?;
    let authority = rest.split(['/', '?']).next()?;
    let default_port = if scheme == "wss" { 443 } else { 80 };
    let with_port = match authority.rsplit_once(':') {
        Some((_, port)) if port.parse::<u16>().is_ok() && !authority.ends_with(']') => authority.to_string(),
        _ => format!("{authority}:{default_port}"),
    };
    with_port.to_socket_addrs().ok()?.next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_signaling_server_means_loopback_candidates() {
        for url in ["ws://127.0.0.1:8787/ws?room=a", "ws://localhost:9/ws", "ws://[::1]:8787/ws", "ws://127.0.0.1/ws"] {
            let (ip, why) = bind_ip_for(url);
            assert_eq!(ip, IpAddr::from([127, 0, 0, 1]), "{url}: {why}");
        }
        let (ip, why) = bind_ip_for("not a url");
        assert_eq!(ip, IpAddr::from([127, 0, 0, 1]));
        assert!(why.contains("cannot resolve"), "{why}");
    }

    #[test]
    fn signal_urls_parse_to_socket_addresses() {
        assert_eq!(signal_address("ws://127.0.0.1:8787/ws?room=x"), Some(([127, 0, 0, 1], 8787).into()));
        assert_eq!(signal_address("ws://127.0.0.1?room=x"), Some(([127, 0, 0, 1], 80).into()));
        assert_eq!(signal_address("wss://127.0.0.1/ws"), Some(([127, 0, 0, 1], 443).into()));
        assert_eq!(signal_address("ws://[::1]:7/ws").map(|a| a.port()), Some(7));
        assert_eq!(signal_address("127.0.0.1:8787"), None);
    }
}
