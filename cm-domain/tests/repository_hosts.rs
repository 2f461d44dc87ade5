//! Property tests of the repository host check against the system's resolver.
//!
//! Addresses are drawn mostly from the ranges a mission may never reach (loopback, unspecified,
//! link-local, the metadata services) and written in every notation the C library reads: one to
//! four parts, each decimal, octal or hex with leading zeros; IPv6 compressed or in full, upper
//! or lower case, with an IPv4 tail, with a zone; then placed in every URL form (`https://`,
//! `ssh://` with and without user and port, `git://`, `git+ssh://`, `http://`, scp-like
//! `user@host:path`), bracketed, percent-encoded, with a trailing dot.
//!
//! The oracle is the system's resolver: the host as a client hands it over (brackets off,
//! percent-encoding decoded as git decodes an `ssh://` URL, a trailing dot taken as the root a
//! resolver reads it as) goes to `getaddrinfo` through `std::net::ToSocketAddrs` on `host:0`.
//! Only numeric hosts are generated, so it never reaches DNS. The properties:
//!
//! - whatever the scheme, a repository whose host the resolver reads as an address a mission may
//!   never reach (classified here, independently of cm's own `denied_address`) is refused, on
//!   the `repository` field;
//! - where the resolver reads an address, cm's `Host::parse` reads the same one or refuses the
//!   host, never another.
//!
//! `PROPTEST_CASES` raises the count for a deeper run; the default keeps CI fast.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, ToSocketAddrs};

use cm_domain::Mission;
use cm_domain::repository::Host;
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence};

/// Why a mission may not reach `ip`, as this test reads the rules (not cm's code): loopback,
/// unspecified (`0.0.0.0/8`, the broadcast address, `::`), link-local, a metadata service; an
/// IPv4 address inside IPv6 (mapped, compatible, NAT64) as that IPv4 address.
fn forbidden(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, _, _] = v4.octets();
            if a == 127 {
                Some("loopback")
            } else if a == 0 || v4 == Ipv4Addr::BROADCAST {
                Some("unspecified")
            } else if a == 169 && b == 254 {
                Some("link-local")
            } else if v4 == Ipv4Addr::new(100, 100, 100, 200) || v4 == Ipv4Addr::new(192, 0, 0, 192)
            {
                Some("metadata")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let tail = Ipv4Addr::from((u32::from(s[6]) << 16) | u32::from(s[7]));
            if v6 == Ipv6Addr::LOCALHOST {
                Some("loopback")
            } else if v6 == Ipv6Addr::UNSPECIFIED {
                Some("unspecified")
            } else if s[0] & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
                Some("metadata")
            } else if s[..5] == [0; 5] && s[5] == 0xffff
                || s[..6] == [0; 6]
                || s[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
            {
                forbidden(IpAddr::V4(tail))
            } else {
                None
            }
        }
    }
}

/// What the system's resolver reads `host` as (`getaddrinfo`, numeric hosts only), or `None`.
fn resolve(host: &str) -> Option<IpAddr> {
    let addresses: Vec<IpAddr> = (host, 0).to_socket_addrs().ok()?.map(|a| a.ip()).collect();
    let first = *addresses.first()?;
    assert!(
        addresses.iter().all(|a| *a == first),
        "{host}: {addresses:?}"
    );
    Some(first)
}

/// An IPv4 address, mostly in the ranges a mission may never reach.
fn ipv4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        3 => any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(127, b, c, d)),
        1 => Just(Ipv4Addr::LOCALHOST),
        2 => any::<[u8; 3]>().prop_map(|[b, c, d]| Ipv4Addr::new(0, b, c, d)),
        1 => Just(Ipv4Addr::UNSPECIFIED),
        1 => Just(Ipv4Addr::BROADCAST),
        2 => any::<[u8; 2]>().prop_map(|[c, d]| Ipv4Addr::new(169, 254, c, d)),
        2 => Just(Ipv4Addr::new(169, 254, 169, 254)),
        1 => Just(Ipv4Addr::new(100, 100, 100, 200)),
        1 => Just(Ipv4Addr::new(192, 0, 0, 192)),
        3 => any::<u32>().prop_map(Ipv4Addr::from),
    ]
}

/// How one number is written: decimal, octal or hex (lower or upper prefix and digits), with
/// up to two extra leading zeros (not for decimal, where a zero makes it octal).
#[derive(Debug, Clone, Copy)]
struct Notation {
    base: u8,
    zeros: usize,
    upper_prefix: bool,
    upper_digits: bool,
}

fn notation() -> impl Strategy<Value = Notation> {
    (0..3u8, 0..3usize, any::<bool>(), any::<bool>()).prop_map(
        |(base, zeros, upper_prefix, upper_digits)| Notation {
            base,
            zeros,
            upper_prefix,
            upper_digits,
        },
    )
}

impl Notation {
    fn write(self, value: u32) -> String {
        let zeros = "0".repeat(self.zeros);
        match self.base {
            0 => value.to_string(),
            1 => format!("0{zeros}{value:o}"),
            _ => {
                let prefix = if self.upper_prefix { "0X" } else { "0x" };
                let digits = if self.upper_digits {
                    format!("{value:X}")
                } else {
                    format!("{value:x}")
                };
                format!("{prefix}{zeros}{digits}")
            }
        }
    }
}

/// `v4` in `parts` parts (1 to 4), each in its own notation: `127.1`, `0x7f000001`, `0177.0.01`.
fn write_ipv4(v4: Ipv4Addr, parts: usize, notations: &[Notation]) -> String {
    let [a, b, c, d] = v4.octets().map(u32::from);
    let values: Vec<u32> = match parts {
        1 => vec![u32::from(v4)],
        2 => vec![a, (b << 16) | (c << 8) | d],
        3 => vec![a, b, (c << 8) | d],
        _ => vec![a, b, c, d],
    };
    values
        .iter()
        .zip(notations)
        .map(|(&value, notation)| notation.write(value))
        .collect::<Vec<_>>()
        .join(".")
}

/// An IPv6 address, mostly one a mission may never reach.
fn ipv6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        2 => Just(Ipv6Addr::LOCALHOST),
        1 => Just(Ipv6Addr::UNSPECIFIED),
        2 => (0..0x40u16, any::<[u16; 7]>()).prop_map(|(low, s)| Ipv6Addr::new(
            0xfe80 | low, s[0], s[1], s[2], s[3], s[4], s[5], s[6]
        )),
        1 => Just(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
        3 => ipv4().prop_map(|v4| v4.to_ipv6_mapped()),
        1 => ipv4().prop_map(|v4| v4.to_ipv6_compatible()),
        1 => ipv4().prop_map(|v4| {
            let [a, b] = [u32::from(v4) >> 16, u32::from(v4) & 0xffff].map(|h| h as u16);
            Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, a, b)
        }),
        2 => any::<u128>().prop_map(Ipv6Addr::from),
    ]
}

/// `v6` written compressed (as std writes it), in full, or with an IPv4 tail; in either case.
fn write_ipv6(v6: Ipv6Addr, style: u8, upper: bool) -> String {
    let s = v6.segments();
    let text = match style {
        0 => v6.to_string(),
        1 => s
            .iter()
            .map(|g| format!("{g:04x}"))
            .collect::<Vec<_>>()
            .join(":"),
        _ => {
            let head: Vec<String> = s[..6].iter().map(|g| format!("{g:x}")).collect();
            let [a, b, c, d] = [s[6] >> 8, s[6] & 0xff, s[7] >> 8, s[7] & 0xff];
            format!("{}:{a}.{b}.{c}.{d}", head.join(":"))
        }
    };
    if upper { text.to_uppercase() } else { text }
}

/// A host as it stands in a URL, and the text a client hands the resolver for it.
#[derive(Debug, Clone)]
struct Written {
    in_url: String,
    for_resolver: String,
}

/// Percent-encodes the characters of `text` whose bit is set in `mask`.
fn percent_encode(text: &str, mask: u64) -> String {
    text.chars()
        .enumerate()
        .map(|(i, c)| {
            if mask >> (i % 64) & 1 == 1 {
                format!("%{:02X}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn written_ipv4() -> impl Strategy<Value = Written> {
    (
        ipv4(),
        1..=4usize,
        prop::collection::vec(notation(), 4),
        0..4u8,
        any::<u64>(),
    )
        .prop_map(|(v4, parts, notations, dress, mask)| {
            let host = write_ipv4(v4, parts, &notations);
            let in_url = match dress {
                0 => host.clone(),
                1 => format!("{host}."),
                2 => percent_encode(&host, mask),
                _ => format!("[{host}]"),
            };
            Written {
                in_url,
                for_resolver: host,
            }
        })
}

fn written_ipv6() -> impl Strategy<Value = Written> {
    (
        ipv6(),
        0..3u8,
        any::<bool>(),
        prop_oneof![Just(None), Just(Some("1")), Just(Some("lo")),],
        any::<bool>(),
    )
        .prop_map(|(v6, style, upper, zone, rfc6874)| {
            let host = write_ipv6(v6, style, upper);
            match zone {
                None => Written {
                    in_url: format!("[{host}]"),
                    for_resolver: host,
                },
                Some(zone) => Written {
                    in_url: format!("[{host}%{}{zone}]", if rfc6874 { "25" } else { "" }),
                    for_resolver: format!("{host}%{zone}"),
                },
            }
        })
}

/// The host in one of the forms git takes for a repository.
fn repository(host: &str, form: u8, port: u16) -> String {
    let port = port.max(1);
    match form {
        0 => format!("https://{host}/team/r.git"),
        1 => format!("https://{host}:{port}/team/r.git"),
        2 => format!("ssh://{host}/team/r.git"),
        3 => format!("ssh://git@{host}:{port}/team/r.git"),
        4 => format!("ssh://deploy-bot@{host}/team/r.git"),
        5 => format!("git://{host}/team/r.git"),
        6 => format!("git+ssh://git@{host}/team/r.git"),
        7 => format!("http://{host}/team/r.git"),
        _ => format!("git@{host}:team/r.git"),
    }
}

fn check(written: &Written, form: u8, port: u16) -> Result<(), TestCaseError> {
    let resolved = resolve(&written.for_resolver);
    // cm reads the address the resolver reads, or refuses the host; never another address.
    if let (Some(expected), Ok(Host::Address(read))) = (resolved, Host::parse(&written.in_url)) {
        prop_assert_eq!(read, expected, "{:?}", written);
    }
    let Some(why) = resolved.and_then(forbidden) else {
        return Ok(());
    };
    let url = repository(&written.in_url, form, port);
    let text = serde_json::json!({"repository": url, "task": "t"}).to_string();
    match Mission::from_json(&text) {
        Ok(m) => prop_assert!(
            false,
            "{url} ({why}: {:?} to the resolver) was accepted as host {:?}",
            written.for_resolver,
            m.host()
        ),
        Err(e) => prop_assert_eq!(e.field(), Some("repository"), "{}: {}", url, e),
    }
    Ok(())
}

proptest! {
    #![proptest_config(Config {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(2000),
        failure_persistence: Some(Box::new(FileFailurePersistence::Off)),
        ..Config::default()
    })]

    /// IPv4 in every inet_aton notation and URL form.
    #[test]
    fn an_ipv4_host_the_resolver_reads_as_forbidden_is_refused(
        written in written_ipv4(), form in 0..9u8, port in any::<u16>(),
    ) {
        check(&written, form, port)?;
    }

    /// IPv6, with zones and IPv4 inside, in every URL form.
    #[test]
    fn an_ipv6_host_the_resolver_reads_as_forbidden_is_refused(
        written in written_ipv6(), form in 0..9u8, port in any::<u16>(),
    ) {
        check(&written, form, port)?;
    }
}

/// The generators reach what they are meant to: the resolver reads their hosts, and most of
/// them as forbidden (a property that held only because nothing was generated would be empty).
#[test]
fn the_generators_write_hosts_the_resolver_reads() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    // glibc takes an interface name as the zone of a link-local address only: `::1%lo` is not
    // read, `::1%1` is.
    for (name, strategy, least) in [
        ("ipv4", written_ipv4().boxed(), 450),
        ("ipv6", written_ipv6().boxed(), 300),
    ] {
        let (mut read, mut denied) = (0, 0);
        for _ in 0..500 {
            let written = strategy.new_tree(&mut runner).unwrap().current();
            if let Some(ip) = resolve(&written.for_resolver) {
                read += 1;
                denied += usize::from(forbidden(ip).is_some());
            }
        }
        assert!(read >= least, "{name}: the resolver read {read} of 500");
        assert!(denied >= 250, "{name}: {denied} of 500 forbidden");
    }
    // The oracle itself: the C library's notations.
    for text in [
        "127.1",
        "0x7f000001",
        "017700000001",
        "2130706433",
        "0x7f.0.0.1",
    ] {
        assert_eq!(
            resolve(text),
            Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{text}"
        );
    }
}
