//! Who a console client is when proxies stand between: the connection's peer, unless
//! that peer is a proxy the configuration trusts (`api.trusted_proxies`), in which case the
//! header it adds (`api.client_address_header`, `X-Forwarded-For` by default) names the
//! client — its last address that is not a trusted proxy's, since a client may write any
//! addresses it likes before the first proxy appends the real one. Login attempts are
//! counted by this address, so clients behind one proxy are not all one client.

use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderName};

/// An address range: `10.0.0.0/8`, `fd00::/8`, or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let net: IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not an address or an address/prefix range"))?;
        let most = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => most,
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= most)
                .ok_or_else(|| format!("`{s}`: the prefix must be 0..={most}"))?,
        };
        Ok(Cidr { net, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        match (self.net, ip) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(i) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(i) & mask
            }
            _ => false,
        }
    }
}

/// An IPv4 address written as IPv6 (`::ffff:10.0.0.1`) is the IPv4 one.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// How this center tells who a client is.
#[derive(Debug, Clone)]
pub struct ClientAddr {
    proxies: Vec<Cidr>,
    header: HeaderName,
}

impl ClientAddr {
    /// From `api.trusted_proxies` and `api.client_address_header` (checked at start).
    pub fn new(trusted_proxies: &[String], header: &str) -> ClientAddr {
        ClientAddr {
            proxies: (trusted_proxies.iter())
                .filter_map(|p| Cidr::parse(p).ok())
                .collect(),
            header: header
                .parse()
                .unwrap_or(HeaderName::from_static("x-forwarded-for")),
        }
    }

    fn trusted(&self, ip: IpAddr) -> bool {
        self.proxies.iter().any(|c| c.contains(ip))
    }

    /// The trusted proxies as the listeners see them: peers many clients share, not held
    /// to `limits.per_client`.
    pub fn shared_peers(&self) -> sluice_runtime::listen::SharedPeers {
        let me = self.clone();
        sluice_runtime::listen::SharedPeers::new(move |ip| me.trusted(canonical(ip)))
    }

    /// The client of a request from `peer` with `headers`.
    pub fn of(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let peer = canonical(peer);
        if !self.trusted(peer) {
            return peer;
        }
        let hops: Vec<&str> = headers
            .get_all(&self.header)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .collect();
        let mut client = peer;
        for hop in hops.iter().rev() {
            match hop.parse::<IpAddr>() {
                Ok(ip) => {
                    client = canonical(ip);
                    if !self.trusted(client) {
                        return client;
                    }
                }
                // Whatever a hop wrote before a trusted proxy's is not to be believed.
                Err(_) => return client,
            }
        }
        client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn with(proxies: &[&str]) -> ClientAddr {
        ClientAddr {
            proxies: proxies.iter().map(|p| Cidr::parse(p).unwrap()).collect(),
            header: HeaderName::from_static("x-forwarded-for"),
        }
    }

    fn forwarded(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", v.parse().unwrap());
        }
        h
    }

    #[test]
    fn ranges_hold_their_addresses() {
        let c = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(c.contains(ip("10.1.2.3")) && !c.contains(ip("11.0.0.1")));
        assert!(c.contains(ip("::ffff:10.9.9.9")));
        assert!(Cidr::parse("192.168.1.7")
            .unwrap()
            .contains(ip("192.168.1.7")));
        assert!(!Cidr::parse("192.168.1.7")
            .unwrap()
            .contains(ip("192.168.1.8")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("8.8.8.8")));
        assert!(Cidr::parse("fd00::/8").unwrap().contains(ip("fd12::1")));
        for bad in ["10.0.0.0/33", "proxy", "10.0.0.0/x", "::/129"] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_client_is_the_last_hop_no_trusted_proxy_wrote() {
        let a = with(&["10.0.0.0/8"]);
        // Straight from the client: the header is the client's own, not believed.
        assert_eq!(
            a.of(ip("203.0.113.5"), &forwarded(&["1.2.3.4"])),
            ip("203.0.113.5")
        );
        // Through the proxy: the address it appended.
        assert_eq!(
            a.of(ip("10.0.0.2"), &forwarded(&["198.51.100.7"])),
            ip("198.51.100.7")
        );
        // A client that wrote a forged first hop gets its real address all the same.
        assert_eq!(
            a.of(ip("10.0.0.2"), &forwarded(&["6.6.6.6, 198.51.100.7"])),
            ip("198.51.100.7")
        );
        // Two trusted proxies, the header over two lines.
        assert_eq!(
            a.of(ip("10.0.0.2"), &forwarded(&["198.51.100.7", "10.0.0.9"])),
            ip("198.51.100.7")
        );
        // No header through the proxy: the proxy.
        assert_eq!(a.of(ip("10.0.0.2"), &HeaderMap::new()), ip("10.0.0.2"));
        assert_eq!(a.of(ip("10.0.0.2"), &forwarded(&["junk"])), ip("10.0.0.2"));
        // Nothing trusted: the peer, always.
        assert_eq!(
            with(&[]).of(ip("10.0.0.2"), &forwarded(&["1.2.3.4"])),
            ip("10.0.0.2")
        );
    }
}
