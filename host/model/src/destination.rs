//! Where completion callbacks may go. Sluice POSTs a task to its `callback_url`; a device must
//! not be able to aim that at the server's own loopback, the machine's metadata service or the
//! hospital's private network. Loopback, private, link-local, unspecified and multicast
//! addresses, and `localhost` names, are refused unless `callback_allow` names the host or a
//! CIDR holding the address. Hosts given by name are checked again when they are resolved.

use std::net::IpAddr;

/// The `callback_allow` setting, parsed: hosts by name and networks by CIDR.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallbackAllow {
    hosts: Vec<String>,
    networks: Vec<(IpAddr, u8)>,
}

impl CallbackAllow {
    /// Each rule is a host name (`receiver.lab`), an address (`10.0.0.7`) or a CIDR
    /// (`10.0.0.0/8`, `fd00::/8`).
    pub fn parse(rules: &[String]) -> Result<CallbackAllow, String> {
        let mut allow = CallbackAllow::default();
        for rule in rules {
            let rule = rule.trim();
            if let Some((address, bits)) = rule.split_once('/') {
                let address: IpAddr = address
                    .parse()
                    .map_err(|_| format!("`{rule}`: not an address before the `/`"))?;
                let most = if address.is_ipv4() { 32 } else { 128 };
                let bits: u8 = bits
                    .parse()
                    .ok()
                    .filter(|&b| b <= most)
                    .ok_or_else(|| format!("`{rule}`: the prefix must be 0 to {most}"))?;
                allow.networks.push((address, bits));
            } else if let Ok(address) = rule.parse::<IpAddr>() {
                allow
                    .networks
                    .push((address, if address.is_ipv4() { 32 } else { 128 }));
            } else if !rule.is_empty() && rule.len() <= 253 {
                allow.hosts.push(rule.to_ascii_lowercase());
            } else {
                return Err(format!("`{rule}`: not a host, an address or a CIDR"));
            }
        }
        Ok(allow)
    }

    pub fn allows_host(&self, host: &str) -> bool {
        self.hosts
            .iter()
            .any(|allowed| allowed.eq_ignore_ascii_case(host))
    }

    pub fn allows_address(&self, address: IpAddr) -> bool {
        self.networks
            .iter()
            .any(|&(network, bits)| in_network(address, network, bits))
    }

    /// Whether a callback may be sent to `address` (reached through host `host`).
    pub fn permits(&self, host: &str, address: IpAddr) -> bool {
        is_public(address) || self.allows_host(host) || self.allows_address(address)
    }
}

/// Whether `address` is one a callback may reach without being allowed: not loopback, private,
/// link-local, unspecified, broadcast, multicast, reserved or documentation space — an IPv6
/// address that carries an IPv4 one (mapped, compatible, NAT64, 6to4) judged by that IPv4
/// address, so `[64:ff9b::a9fe:a9fe]` is 169.254.169.254.
pub fn is_public(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                // 0.0.0.0/8 "this network", the unspecified address among them.
                || o[0] == 0
                // 100.64.0.0/10, carrier-grade NAT: private in practice.
                || (o[0] == 100 && (o[1] & 0xC0) == 64)
                // 192.0.0.0/24, IETF protocol assignments.
                || (o[0] == 192 && o[1] == 0 && o[2] == 0)
                // 198.18.0.0/15, benchmarking networks.
                || (o[0] == 198 && (o[1] & 0xFE) == 18)
                // 240.0.0.0/4, reserved.
                || o[0] >= 240)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = embedded_ipv4(v6) {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                // fc00::/7 unique local, fe80::/10 link-local, fec0::/10 the old site-local.
                || (s[0] & 0xFE00) == 0xFC00
                || (s[0] & 0xFFC0) == 0xFE80
                || (s[0] & 0xFFC0) == 0xFEC0
                // 2001:db8::/32 documentation; 2001::/32 Teredo, whose client address is
                // hidden; 64:ff9b:1::/48 local-use NAT64; 100::/64 discard-only.
                || (s[0] == 0x2001 && (s[1] == 0x0db8 || s[1] == 0))
                || (s[0] == 0x0064 && s[1] == 0xff9b && s[2] == 1)
                || (s[0] == 0x0100 && s[1..4] == [0, 0, 0]))
        }
    }
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) or 6to4 (`2002:AABB:CCDD::`).
fn embedded_ipv4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    if let Some(v4) = v6.to_ipv4_mapped() {
        return Some(v4);
    }
    let s = v6.segments();
    let low = std::net::Ipv4Addr::from_bits(v6.to_bits() as u32);
    if s[..6] == [0; 6] && !v6.is_unspecified() && !v6.is_loopback() {
        return Some(low);
    }
    if s[..6] == [0x0064, 0xff9b, 0, 0, 0, 0] {
        return Some(low);
    }
    if s[0] == 0x2002 {
        return Some(std::net::Ipv4Addr::from_bits(
            (u32::from(s[1]) << 16) | u32::from(s[2]),
        ));
    }
    None
}

/// Whether `host` names the local machine whatever it resolves to.
pub fn is_local_name(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost")
}

fn in_network(address: IpAddr, network: IpAddr, bits: u8) -> bool {
    let (address, network, width) = match (address, network) {
        (IpAddr::V4(a), IpAddr::V4(n)) => (u128::from(a.to_bits()), u128::from(n.to_bits()), 32),
        (IpAddr::V6(a), IpAddr::V6(n)) => (a.to_bits(), n.to_bits(), 128),
        _ => return false,
    };
    let shift = width - u32::from(bits);
    shift >= width || (address >> shift) == (network >> shift)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn private_and_local_addresses_are_refused_unless_allowed() {
        for refused in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            // IPv6 forms that carry a private IPv4 address, and other reserved IPv6 space.
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
            "64:ff9b:1::5db8:d822",
            "fec0::1",
            "2001:db8::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
            "100::1",
            // Reserved IPv4.
            "0.0.0.1",
            "192.0.0.8",
            "198.18.0.1",
            "198.19.255.255",
            "240.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!is_public(ip(refused)), "{refused}");
        }
        for public in [
            "93.184.216.34",
            "2606:2800:220:1::1",
            "64:ff9b::5db8:d822",
            "2002:5db8:d822::1",
            "198.20.0.1",
            "::ffff:93.184.216.34",
        ] {
            assert!(is_public(ip(public)), "{public}");
        }
        let allow = CallbackAllow::parse(&[
            "10.0.0.0/8".into(),
            "127.0.0.1".into(),
            "Receiver.Lab".into(),
        ])
        .unwrap();
        assert!(allow.permits("x", ip("10.200.0.1")));
        assert!(allow.permits("x", ip("127.0.0.1")));
        assert!(!allow.permits("x", ip("127.0.0.2")));
        assert!(!allow.permits("x", ip("192.168.0.1")));
        assert!(allow.permits("receiver.lab", ip("192.168.0.1")));
        assert!(is_local_name("LOCALHOST.") && is_local_name("api.localhost"));
        assert!(!is_local_name("localhost.example"));
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        for bad in ["10.0.0.0/33", "nonsense/8", "", "::/129"] {
            assert!(CallbackAllow::parse(&[bad.into()]).is_err(), "{bad}");
        }
        assert!(
            CallbackAllow::parse(&["0.0.0.0/0".into()])
                .unwrap()
                .allows_address(ip("10.0.0.1"))
        );
    }
}
