//! Address blocks in CIDR notation (`10.0.0.0/8`, `2001:db8::/32`), for
//! rules that exempt some clients.

use std::net::IpAddr;

/// An IPv4 or IPv6 block: an address and how many leading bits matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Parses `ADDR/BITS`, or a bare address (a block of one). Bits beyond
    /// the prefix must be zero, so that a typo such as `10.1.2.3/8` is
    /// caught rather than read as `10.0.0.0/8`.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, bits) = match text.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("`{text}` is not an IPv4 or IPv6 address or block"))?;
        let max = if network.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => b
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= max)
                .ok_or_else(|| format!("`{text}`: the prefix length must be 0 to {max}"))?,
        };
        let cidr = Cidr { network, bits };
        if Cidr::masked(network, bits) != Cidr::masked(network, max) {
            return Err(format!(
                "`{text}` has address bits set beyond its /{bits} prefix; write the block's first address"
            ));
        }
        Ok(cidr)
    }

    /// The address as a 128-bit number with only the first `bits` kept
    /// (IPv4 in the low 32 bits).
    fn masked(addr: IpAddr, bits: u8) -> u128 {
        let (value, width) = match addr {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32),
            IpAddr::V6(v6) => (u128::from(v6), 128),
        };
        let keep = u32::from(bits);
        if keep == 0 {
            0
        } else {
            value >> (width - keep) << (width - keep)
        }
    }

    /// Whether `addr` lies in the block. An IPv4-mapped IPv6 address counts
    /// as its IPv4 address.
    pub fn contains(&self, addr: IpAddr) -> bool {
        let addr = match addr {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(addr, IpAddr::V4),
            v4 => v4,
        };
        addr.is_ipv4() == self.network.is_ipv4()
            && Cidr::masked(addr, self.bits) == Cidr::masked(self.network, self.bits)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.network, self.bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_contain_their_addresses_only() {
        let v4 = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(v4.contains(ip("10.255.0.1")));
        assert!(v4.contains(ip("::ffff:10.1.2.3")));
        assert!(!v4.contains(ip("11.0.0.1")));
        assert!(!v4.contains(ip("2001:db8::1")));
        let v6 = Cidr::parse("2001:db8::/32").unwrap();
        assert!(v6.contains(ip("2001:db8:ffff::1")));
        assert!(!v6.contains(ip("2001:db9::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        let one = Cidr::parse("203.0.113.9").unwrap();
        assert!(one.contains(ip("203.0.113.9")) && !one.contains(ip("203.0.113.8")));
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains(ip("1.2.3.4")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("::1")));
    }

    #[test]
    fn bad_blocks_say_why() {
        for bad in [
            "10.0.0.0/33",
            "2001:db8::/129",
            "10.1.2.3/8",
            "example.com/8",
            "10.0.0.0/x",
            "",
        ] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
    }
}
