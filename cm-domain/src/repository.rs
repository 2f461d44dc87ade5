//! A mission's repository, read once whatever its form, and its host read as a name or an
//! address.
//!
//! Every form git takes for a remote repository goes through [`Repository::parse`]:
//! `https://host/path`, `ssh://[user@]host[:port]/path`, `git://host/path` (and any other
//! `scheme://`), and the scp-like `user@host:path`. The host, wherever it stands, goes through
//! one function, [`Host::parse`]: brackets are taken off, percent-encoding decoded (git decodes
//! an `ssh://` URL before ssh sees it), one trailing dot dropped, and the result is an
//! [`Host::Address`] if the C library would read it as one (every IPv4 notation `inet_aton`
//! accepts: `127.1`, `0x7f000001`, `017700000001`, `2130706433`, mixed; IPv6 with a zone) or a
//! [`Host::Name`]. A host that is neither (`1.2.3.08`, a name ending in a number, a name with a
//! character DNS does not allow) is refused, so no client reads it differently.
//!
//! [`denied_address`] says why an address is one a mission may never reach (loopback,
//! link-local, unspecified, a metadata service), looking through IPv4-mapped, -compatible and
//! NAT64 forms. A name can only be checked by resolving it, which the dispatch does
//! (`cm-dispatch`); [`denied_name`] refuses the names that are the scheduler's own host or a
//! metadata service without resolving them.
//!
//! ```
//! use cm_domain::repository::{Host, Repository, denied_address};
//!
//! let repo = Repository::parse("ssh://git@0x7f000001:5432/r.git").unwrap();
//! let Host::Address(ip) = repo.host() else { panic!() };
//! assert_eq!(ip.to_string(), "127.0.0.1");
//! assert_eq!(denied_address(*ip), Some("a loopback address"));
//!
//! let repo = Repository::parse("deploy@Git.Example.COM.:team/r.git").unwrap();
//! assert_eq!(repo.host(), &Host::Name("git.example.com".into()));
//! ```

use core::fmt;
// The address types only (`core::net`): the domain opens no socket.
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A repository's host: a DNS name or an address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A name: lowercase ASCII letters, digits, `-` and `.`, without a trailing dot.
    Name(String),
    /// An address, however it was written (a zone, if any, is dropped: it does not change which
    /// address is reached).
    Address(IpAddr),
}

/// The most characters of a host name, as DNS allows.
pub const MAX_HOST_NAME_CHARS: usize = 253;

/// Host names a repository may never name: the scheduler's own host and the cloud metadata
/// services, which hand out the credentials of the machine a mission runs on. `*.` stands for
/// any subdomain.
pub const DENIED_HOST_NAMES: [&str; 7] = [
    "localhost",
    "*.localhost",
    "metadata",
    "metadata.google.internal",
    "instance-data",
    "instance-data.ec2.internal",
    "metadata.tencentyun.com",
];

impl Host {
    /// Reads a host as it stands in a URL or an scp-like address: `[…]` around an IPv6 address
    /// (with a zone as `%25eth0` or `%eth0`) or any other host, percent-encoding decoded, one
    /// trailing dot dropped. An IPv6 address must be in brackets. The error says what is wrong.
    ///
    /// ```
    /// use cm_domain::repository::Host;
    /// for form in ["127.1", "0x7f000001", "017700000001", "2130706433", "0x7f.0.1", "127.0.0.1.",
    ///              "127.0.0.%31", "[127.0.0.1]", "[::ffff:127.0.0.1]", "[::1%25lo]"] {
    ///     assert!(matches!(Host::parse(form), Ok(Host::Address(ip)) if ip.to_canonical().is_loopback()), "{form}");
    /// }
    /// assert_eq!(Host::parse("Git.Example.com."), Ok(Host::Name("git.example.com".into())));
    /// assert!(Host::parse("1.2.3.08").is_err());
    /// assert!(Host::parse("::1").is_err());
    /// ```
    pub fn parse(raw: &str) -> Result<Host, String> {
        if raw.is_empty() {
            return Err("must name a host".into());
        }
        if let Some(inner) = raw.strip_prefix('[') {
            let inner = inner
                .strip_suffix(']')
                .ok_or_else(|| format!("{raw:?} opens a [ it does not close"))?;
            return parse_bracketed(inner).map_err(|why| format!("[{inner}] {why}"));
        }
        let decoded = percent_decode(raw)?;
        parse_unbracketed(&decoded).map_err(|why| {
            if decoded == raw {
                format!("{raw:?} {why}")
            } else {
                format!("{raw:?} (decoded {decoded:?}) {why}")
            }
        })
    }

    /// The host as text: the name, or the address in its usual form (IPv6 without brackets).
    pub fn as_text(&self) -> String {
        match self {
            Host::Name(name) => name.clone(),
            Host::Address(ip) => ip.to_string(),
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(name) => f.write_str(name),
            Host::Address(IpAddr::V6(v6)) => write!(f, "[{v6}]"),
            Host::Address(IpAddr::V4(v4)) => write!(f, "{v4}"),
        }
    }
}

/// What stood between `[` and `]`: an IPv6 address and an optional zone, or (as git reads
/// `ssh://[host]:port/…`, taking the brackets off) an IPv4 address or a name.
///
/// Git decodes an `ssh://` URL before it splits the zone off, curl takes `%25` as the zone's
/// start and decodes nothing else: `[fd00:ec2::25%34]` is `fd00:ec2::25` in zone `34` to one
/// and `fd00:ec2::254` to the other. Both readings are made, and an address they disagree on
/// is refused.
fn parse_bracketed(inner: &str) -> Result<Host, String> {
    if !inner.contains(':') {
        let decoded = percent_decode(inner)?;
        return parse_unbracketed(&decoded);
    }
    let raw = read_ipv6(inner)?;
    let decoded = lenient_decode(inner);
    if decoded != inner {
        let other = read_ipv6(&decoded).map_err(|why| format!("(decoded {decoded:?}) {why}"))?;
        if other != raw {
            return Err(format!(
                "is read as {raw} and, decoded, as {other}: percent-encoding in an address is \
                 not allowed"
            ));
        }
    }
    Ok(Host::Address(IpAddr::V6(raw)))
}

/// An IPv6 address, then optionally `%` and a zone (`%25eth0` as RFC 6874 writes it in a URL,
/// `%eth0` as ssh and getaddrinfo take it).
fn read_ipv6(text: &str) -> Result<Ipv6Addr, String> {
    let (address, zone) = match text.split_once('%') {
        Some((address, zone)) => (address, Some(zone)),
        None => (text, None),
    };
    if let Some(zone) = zone {
        let zone = zone
            .strip_prefix("25")
            .filter(|z| !z.is_empty())
            .unwrap_or(zone);
        if zone.is_empty()
            || !zone
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return Err(format!(
                "has a zone {zone:?} that is not an interface name or number"
            ));
        }
    }
    address
        .parse::<Ipv6Addr>()
        .map_err(|_| "is not an IPv6 address".into())
}

/// `%XX` decoded where `XX` are two hex digits, any other `%` kept, as git's `url_decode`
/// does; a byte that is not ASCII is kept escaped (no host holds one).
fn lenient_decode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let escape = rest.get(at + 1..at + 3);
        match escape
            .filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
            .map(|h| u8::from_str_radix(h, 16).expect("two hex digits"))
            .filter(u8::is_ascii)
        {
            Some(byte) => {
                out.push(byte as char);
                rest = &rest[at + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// A host without brackets, already decoded: an IPv4 address in any notation `inet_aton`
/// accepts, or a DNS name.
fn parse_unbracketed(host: &str) -> Result<Host, String> {
    if host.contains(':') {
        return Err("is not a host: an IPv6 address must be written in brackets".into());
    }
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return Err("is not a host name".into());
    }
    if let Some(v4) = inet_aton(host) {
        return Ok(Host::Address(IpAddr::V4(v4)));
    }
    let last = host.rsplit('.').next().unwrap_or(host);
    if looks_numeric(last) {
        // A URL parser reads a host ending in a number as an IPv4 address, a resolver may try
        // it as a name: one that is not a valid address is refused, not guessed at.
        return Err("ends in a number but is not an IPv4 address".into());
    }
    let name = host.to_ascii_lowercase();
    let labels_ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    });
    if !labels_ok || name.len() > MAX_HOST_NAME_CHARS {
        return Err(
            "is not a host name: ASCII letters, digits and - in dot-separated labels (an \
             internationalized name in its xn-- form)"
                .into(),
        );
    }
    Ok(Host::Name(name))
}

/// Whether a label is a number as a URL parser or `inet_aton` would try to read one: decimal
/// digits, or `0x` and hex digits (also none).
fn looks_numeric(label: &str) -> bool {
    let hex = label
        .strip_prefix("0x")
        .or_else(|| label.strip_prefix("0X"));
    match hex {
        Some(digits) => digits.chars().all(|c| c.is_ascii_hexdigit()),
        None => !label.is_empty() && label.chars().all(|c| c.is_ascii_digit()),
    }
}

/// The IPv4 address `text` stands for as glibc's `inet_aton` reads it, or `None`: one to four
/// parts separated by dots, each decimal, octal (a leading `0`) or hex (`0x`, at least one
/// digit); every part but the last at most 255, the last filling the remaining bytes
/// (`127.1` is 127.0.0.1, `2130706433` is too). Nothing may follow: no trailing dot, space or
/// other character.
///
/// ```
/// use cm_domain::repository::inet_aton;
/// use core::net::Ipv4Addr;
/// for text in ["127.0.0.1", "127.1", "127.0.1", "0x7f000001", "017700000001", "2130706433",
///              "0x7f.1", "0177.0.0.01", "0X7F.0x0.0.1"] {
///     assert_eq!(inet_aton(text), Some(Ipv4Addr::LOCALHOST), "{text}");
/// }
/// for text in ["", "1.", ".1", "1..1", "0x", "08", "1.2.3.4.5", "256.1", "1.2.3.256",
///              "4294967296", "1.16777216", "a.1", " 1", "1 "] {
///     assert_eq!(inet_aton(text), None, "{text:?}");
/// }
/// ```
pub fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let parts: Vec<&str> = text.split('.').collect();
    if parts.len() > 4 {
        return None;
    }
    let mut values = Vec::with_capacity(parts.len());
    for part in &parts {
        values.push(c_number(part)?);
    }
    let (last, leading) = values.split_last()?;
    if leading.iter().any(|&v| v > 0xff) {
        return None;
    }
    let last_bits = 8 * (4 - leading.len() as u32);
    if last_bits < 32 && *last >> last_bits != 0 {
        return None;
    }
    let mut address: u32 = 0;
    for (i, &byte) in leading.iter().enumerate() {
        address |= byte << (24 - 8 * i as u32);
    }
    Some(Ipv4Addr::from(address | *last))
}

/// One part of an `inet_aton` address: `strtoul(part, base 0)` that must start with a digit,
/// consume the whole part and fit in 32 bits.
fn c_number(part: &str) -> Option<u32> {
    if !part.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if part.len() > 1 && part.starts_with('0') {
            (&part[1..], 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    // Leading zeros never overflow; strip them so a long run of them is still read.
    let significant = digits.trim_start_matches('0');
    if significant.is_empty() {
        return Some(0);
    }
    u32::from_str_radix(significant, radix).ok()
}

/// Decodes `%XX` escapes; the result must be ASCII (a host is, and so is a user name).
fn percent_decode(text: &str) -> Result<String, String> {
    if !text.contains('%') {
        return Ok(text.to_owned());
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()))
                .ok_or_else(|| {
                    format!("{text:?} has a % that is not followed by two hex digits")
                })?;
            out.push(u8::from_str_radix(hex, 16).expect("two hex digits"));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if !out.is_ascii() {
        return Err(format!("{text:?} decodes to something that is not ASCII"));
    }
    Ok(String::from_utf8(out).expect("ASCII is UTF-8"))
}

/// Why a mission may never reach `ip`, or `None`. An IPv4 address written as IPv6 (mapped
/// `::ffff:a.b.c.d`, compatible `::a.b.c.d`, translated `::ffff:0:a.b.c.d`, NAT64
/// `64:ff9b::a.b.c.d`) is checked as that IPv4 address too.
///
/// ```
/// use cm_domain::repository::denied_address;
/// for ip in ["127.0.0.1", "127.255.0.9", "0.0.0.0", "0.1.2.3", "255.255.255.255", "169.254.169.254",
///            "169.254.0.23", "100.100.100.200", "192.0.0.192", "::1", "::", "fe80::1", "febf::1",
///            "fd00:ec2::254", "::ffff:127.0.0.1", "::127.0.0.1", "64:ff9b::a9fe:a9fe"] {
///     assert!(denied_address(ip.parse().unwrap()).is_some(), "{ip}");
/// }
/// for ip in ["10.0.0.5", "192.168.1.1", "8.8.8.8", "2001:db8::1", "fec0::1", "::ffff:10.0.0.1"] {
///     assert_eq!(denied_address(ip.parse().unwrap()), None, "{ip}");
/// }
/// ```
pub fn denied_address(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => denied_v4(v4),
        IpAddr::V6(v6) => denied_v6(v6).or_else(|| embedded_v4(v6).and_then(denied_v4)),
    }
}

fn denied_v4(v4: Ipv4Addr) -> Option<&'static str> {
    const METADATA_V4: [Ipv4Addr; 2] = [
        // Alibaba Cloud's metadata service.
        Ipv4Addr::new(100, 100, 100, 200),
        // Oracle Cloud's older metadata service.
        Ipv4Addr::new(192, 0, 0, 192),
    ];
    if v4.is_loopback() {
        Some("a loopback address")
    } else if v4.octets()[0] == 0 || v4.is_broadcast() {
        Some("an unspecified address (it reaches the local host)")
    } else if v4 == Ipv4Addr::new(169, 254, 169, 254) {
        Some("the metadata service's address")
    } else if v4.is_link_local() {
        Some("a link-local address (where metadata services answer)")
    } else if METADATA_V4.contains(&v4) {
        Some("a metadata service's address")
    } else {
        None
    }
}

fn denied_v6(v6: Ipv6Addr) -> Option<&'static str> {
    if v6.is_loopback() {
        Some("a loopback address")
    } else if v6.is_unspecified() {
        Some("an unspecified address (it reaches the local host)")
    } else if v6 == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        Some("the metadata service's address")
    } else if v6.segments()[0] & 0xffc0 == 0xfe80 {
        Some("a link-local address (where metadata services answer)")
    } else {
        None
    }
}

/// The IPv4 address an IPv6 address carries in its last 32 bits, if it is of a form that
/// reaches that IPv4 address (or once did): mapped, compatible, translated or NAT64.
fn embedded_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = v6.segments();
    let v4 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    let mapped = s[..5] == [0; 5] && s[5] == 0xffff;
    let compatible = s[..6] == [0; 6];
    let translated = s[..4] == [0; 4] && s[4] == 0xffff && s[5] == 0;
    let nat64 = s[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (mapped || compatible || translated || nat64).then_some(v4)
}

/// Why a mission may never reach the host `name` (lowercase, no trailing dot), by its name
/// alone ([`DENIED_HOST_NAMES`]), or `None`.
pub fn denied_name(name: &str) -> Option<&'static str> {
    DENIED_HOST_NAMES
        .iter()
        .any(|pattern| match pattern.strip_prefix("*.") {
            Some(domain) => name
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => *pattern == name,
        })
        .then_some("the scheduler's own host or a metadata service")
}

/// A repository's location, split once: how it is reached, as whom, where, and what path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repository {
    scheme: Option<String>,
    user: Option<String>,
    host: Host,
    port: Option<u16>,
    path: String,
}

impl Repository {
    /// Splits `text` into its parts: `scheme://[user@]host[:port]/path` for any scheme (the
    /// caller decides which schemes it allows), or scp-like `user@host:path`. Refused: spaces,
    /// control characters, `\`, `?` and `#` anywhere (parsers disagree about them); a password
    /// (`user:…@`); more than one `@` before the host; a port that is not 1 to 65535; a host
    /// [`Host::parse`] refuses.
    pub fn parse(text: &str) -> Result<Repository, String> {
        if let Some(c) = text
            .chars()
            .find(|&c| c.is_whitespace() || c.is_control() || matches!(c, '\\' | '?' | '#'))
        {
            return Err(format!("must not contain {c:?}"));
        }
        match text.split_once("://") {
            Some((scheme, rest)) => Repository::parse_url(scheme, rest),
            None => Repository::parse_scp(text),
        }
    }

    fn parse_url(scheme: &str, rest: &str) -> Result<Repository, String> {
        let scheme_ok = scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !scheme_ok {
            return Err("must be an https:// or ssh:// URL or user@host:path".into());
        }
        let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if authority.is_empty() {
            return Err("must name a host".into());
        }
        let (user, host_port) = match authority.rsplit_once('@') {
            Some((userinfo, host_port)) => (Some(read_user(userinfo)?), host_port),
            None => (None, authority),
        };
        let (host, port) = split_port(host_port)?;
        Ok(Repository {
            scheme: Some(scheme.to_ascii_lowercase()),
            user,
            host: Host::parse(host)?,
            port,
            path: path.to_owned(),
        })
    }

    fn parse_scp(text: &str) -> Result<Repository, String> {
        let not_a_form = || "must be an https:// or ssh:// URL or user@host:path".to_owned();
        let (user, after) = text.split_once('@').ok_or_else(not_a_form)?;
        if user.contains(':') || user.contains('/') {
            return Err(not_a_form());
        }
        let (host, path) = if after.starts_with('[') {
            let close = after
                .find(']')
                .ok_or_else(|| format!("{after:?} opens a [ it does not close"))?;
            let path = after[close + 1..]
                .strip_prefix(':')
                .ok_or_else(|| "user@host:path needs a : after the host".to_owned())?;
            (&after[..=close], path)
        } else {
            after
                .split_once(':')
                .ok_or_else(|| "user@host:path needs a : after the host".to_owned())?
        };
        if host.contains('@') {
            return Err("has more than one @ before the host".into());
        }
        if path.is_empty() || path.starts_with(['-', '/', ':']) {
            return Err(
                "user@host:path needs a path after the colon, not starting with -, / or :".into(),
            );
        }
        Ok(Repository {
            scheme: None,
            user: Some(read_user(user)?),
            host: Host::parse(host)?,
            port: None,
            path: path.to_owned(),
        })
    }

    /// The scheme, lowercase (`https`), or `None` for the scp-like form.
    pub fn scheme(&self) -> Option<&str> {
        self.scheme.as_deref()
    }

    /// The user, decoded (`git`), if one is given.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port, if one is given.
    pub fn port(&self) -> Option<u16> {
        self.port
    }

    /// The path as written: from its `/` in a URL, after the `:` in the scp-like form.
    pub fn path(&self) -> &str {
        &self.path
    }
}

/// The user of `user@`: no password, one `@` at most, and (decoded) letters, digits, `.`, `_`
/// and `-`, not starting with `-` (ssh would read it as an option).
fn read_user(userinfo: &str) -> Result<String, String> {
    if userinfo.contains(':') {
        return Err("must not carry credentials; they are operator configuration".into());
    }
    if userinfo.contains('@') {
        return Err("has more than one @ before the host".into());
    }
    let user = percent_decode(userinfo)?;
    if user.is_empty()
        || user.starts_with('-')
        || !user
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err(format!(
            "user {user:?} is not allowed: letters, digits, ., _ and -, not starting with -"
        ));
    }
    Ok(user)
}

/// `host[:port]` or `[v6][:port]`.
fn split_port(host_port: &str) -> Result<(&str, Option<u16>), String> {
    let (host, port) = if host_port.starts_with('[') {
        let close = host_port
            .find(']')
            .ok_or_else(|| format!("{host_port:?} opens a [ it does not close"))?;
        let rest = &host_port[close + 1..];
        if rest.is_empty() {
            (host_port, None)
        } else {
            let port = rest
                .strip_prefix(':')
                .ok_or_else(|| format!("{rest:?} after ] is not a port"))?;
            (&host_port[..=close], Some(port))
        }
    } else {
        match host_port.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err(format!(
                    "{host_port:?} is not a host and port: an IPv6 address must be written in \
                     brackets"
                ));
            }
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    let port = match port {
        None => None,
        Some(text) => {
            let number = text
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0 && text.chars().all(|c| c.is_ascii_digit()))
                .ok_or_else(|| format!("port {text:?} is not a number from 1 to 65535"))?;
            Some(number)
        }
    };
    Ok((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn every_ipv4_notation_reads_as_the_c_library_reads_it() {
        for (text, expected) in [
            ("127.0.0.1", "127.0.0.1"),
            ("127.1", "127.0.0.1"),
            ("127.0.1", "127.0.0.1"),
            ("2130706433", "127.0.0.1"),
            ("0x7f000001", "127.0.0.1"),
            ("0X7F000001", "127.0.0.1"),
            ("017700000001", "127.0.0.1"),
            ("0x7f.1", "127.0.0.1"),
            ("0177.0.0.1", "127.0.0.1"),
            ("0x7f.0.0.0x1", "127.0.0.1"),
            ("0x7f.0x0.1", "127.0.0.1"),
            ("0000000177.1", "127.0.0.1"),
            ("0", "0.0.0.0"),
            ("00", "0.0.0.0"),
            ("0x0", "0.0.0.0"),
            ("169.254.43518", "169.254.169.254"),
            ("169.16689662", "169.254.169.254"),
            ("0xa9fea9fe", "169.254.169.254"),
            ("0251.0376.0251.0376", "169.254.169.254"),
            ("4294967295", "255.255.255.255"),
            ("1.2.3.4", "1.2.3.4"),
            ("10.0.0.5", "10.0.0.5"),
        ] {
            assert_eq!(
                inet_aton(text).map(IpAddr::V4),
                Some(address(expected)),
                "{text}"
            );
        }
        for text in [
            "",
            ".",
            "1.",
            ".1",
            "1..2",
            "0x",
            "0x.1",
            "08",
            "09.1",
            "0xg",
            "1.2.3.4.5",
            "256.1",
            "1.256.1",
            "1.2.65536",
            "1.2.3.256",
            "1.16777216",
            "4294967296",
            "99999999999999999999",
            "a",
            "1a",
            "1.a",
            " 1",
            "1 ",
            "+1",
            "-1",
            "1e3",
        ] {
            assert_eq!(inet_aton(text), None, "{text:?}");
        }
    }

    #[test]
    fn hosts_are_names_or_addresses() {
        for (raw, expected) in [
            ("Git.Example.COM", Host::Name("git.example.com".into())),
            ("git.example.com.", Host::Name("git.example.com".into())),
            (
                "xn--bcher-kva.example",
                Host::Name("xn--bcher-kva.example".into()),
            ),
            ("127.0.0.1.nip.io", Host::Name("127.0.0.1.nip.io".into())),
            ("g%69t.example", Host::Name("git.example".into())),
            ("127.0.0.1", Host::Address(address("127.0.0.1"))),
            ("127.0.0.1.", Host::Address(address("127.0.0.1"))),
            ("127.0.0.%31", Host::Address(address("127.0.0.1"))),
            ("%31%32%37.1", Host::Address(address("127.0.0.1"))),
            ("0x7F000001.", Host::Address(address("127.0.0.1"))),
            ("[::1]", Host::Address(address("::1"))),
            (
                "[::ffff:127.0.0.1]",
                Host::Address(address("::ffff:127.0.0.1")),
            ),
            (
                "[::FFFF:7F00:1]",
                Host::Address(address("::ffff:127.0.0.1")),
            ),
            ("[fe80::1%25eth0]", Host::Address(address("fe80::1"))),
            ("[fe80::1%eth0]", Host::Address(address("fe80::1"))),
            ("[fe80::1%2]", Host::Address(address("fe80::1"))),
            ("[127.0.0.1]", Host::Address(address("127.0.0.1"))),
            ("[127.1]", Host::Address(address("127.0.0.1"))),
            ("[localhost]", Host::Name("localhost".into())),
            ("[2001:db8::1]", Host::Address(address("2001:db8::1"))),
            (
                "[2001:db8::1%25eth0]",
                Host::Address(address("2001:db8::1")),
            ),
            ("[2001:DB8::1]", Host::Address(address("2001:db8::1"))),
        ] {
            assert_eq!(Host::parse(raw), Ok(expected), "{raw}");
        }
        for raw in [
            "",
            "::1",
            "fe80::1",
            "[::1",
            "[]",
            "[::1%]",
            "[::1%25]",
            "[fd00:ec2::25%34]",
            "[::%31]",
            "[::1%25%30]",
            "[::1%e/0]",
            "[:::1]",
            "[::1]x",
            "1.2.3.08",
            "1.2.3.4.5",
            "a.1",
            "example.0x1",
            "host.0x",
            "127.0.0.1..",
            "a..b",
            ".a",
            "-a.example",
            "a-.example",
            "a_b.example",
            "a%2Fb",
            "a%40b",
            "%zz",
            "%",
            "a%2",
            "%E2%93%9Bocalhost",
            "ⓛocalhost",
            "１２７.0.0.1",
            "127.0.0.%2531",
            "a%2eb%2e.",
        ] {
            assert!(
                Host::parse(raw).is_err(),
                "{raw:?} was read as {:?}",
                Host::parse(raw)
            );
        }
        let long = format!("{}.example", "a.".repeat(125));
        assert!(long.len() > MAX_HOST_NAME_CHARS);
        assert!(Host::parse(&long).is_err());
        assert!(Host::parse(&format!("{}.example", "a".repeat(64))).is_err());
    }

    #[test]
    fn repositories_split_once_whatever_their_form() {
        for (text, scheme, user, host, port, path) in [
            (
                "https://git.example.com/team/r.git",
                Some("https"),
                None,
                "git.example.com",
                None,
                "/team/r.git",
            ),
            (
                "HTTPS://Git.Example.com:8443/r",
                Some("https"),
                None,
                "git.example.com",
                Some(8443),
                "/r",
            ),
            (
                "ssh://git@127.0.0.1:5432/r.git",
                Some("ssh"),
                Some("git"),
                "127.0.0.1",
                Some(5432),
                "/r.git",
            ),
            (
                "ssh://git@0x7f000001:5432/r.git",
                Some("ssh"),
                Some("git"),
                "127.0.0.1",
                Some(5432),
                "/r.git",
            ),
            (
                "ssh://git@[::1]:22/r.git",
                Some("ssh"),
                Some("git"),
                "::1",
                Some(22),
                "/r.git",
            ),
            (
                "ssh://git%2Dbot@h.example/r",
                Some("ssh"),
                Some("git-bot"),
                "h.example",
                None,
                "/r",
            ),
            (
                "git://169.254.169.254/latest",
                Some("git"),
                None,
                "169.254.169.254",
                None,
                "/latest",
            ),
            (
                "git@git.example.com:team/r.git",
                None,
                Some("git"),
                "git.example.com",
                None,
                "team/r.git",
            ),
            (
                "deploy@[::1]:r.git",
                None,
                Some("deploy"),
                "::1",
                None,
                "r.git",
            ),
            (
                "git@h.example:team/r@v1:x",
                None,
                Some("git"),
                "h.example",
                None,
                "team/r@v1:x",
            ),
            ("file:///etc", Some("file"), None, "", None, ""),
        ] {
            let parsed = Repository::parse(text);
            if host.is_empty() {
                assert!(parsed.is_err(), "{text}: {parsed:?}");
                continue;
            }
            let repo = parsed.unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(repo.scheme(), scheme, "{text}");
            assert_eq!(repo.user(), user, "{text}");
            assert_eq!(repo.host().as_text(), host, "{text}");
            assert_eq!(repo.port(), port, "{text}");
            assert_eq!(repo.path(), path, "{text}");
        }
        for text in [
            "",
            "/srv/git/r.git",
            "./r",
            "r.git",
            "host:r.git",
            "127.0.0.1:r.git",
            "https://",
            "https:///r",
            "https://h.example\\@127.0.0.1/r",
            "https://127.0.0.1?@h.example/r",
            "https://127.0.0.1#@h.example/r",
            "https://h.example/r?x",
            "https://a@b@h.example/r",
            "https://user:pw@h.example/r",
            "https://:@h.example/r",
            "https://@h.example/r",
            "ssh://h.example:/r",
            "ssh://h.example:0/r",
            "ssh://h.example:65536/r",
            "ssh://h.example:+22/r",
            "ssh://h.example:22:22/r",
            "ssh://::1/r",
            "ssh://[::1/r",
            "ssh://[::1]x/r",
            "ssh://[git@127.0.0.1]/r",
            "ssh://-oProxyCommand=x@h.example/r",
            "ssh://a%20b@h.example/r",
            "ssh://a%40b@h.example/r",
            "1ssh://h.example/r",
            "s_h://h.example/r",
            "git@host",
            "git@host:",
            "git@host:-x",
            "git@host:/abs",
            "git@host::x",
            "git@[::1]r.git",
            "git@[::1",
            "a@b@host:x",
            "@host:x",
            "-o@host:x",
            "ext::sh -c id",
            "ext::sh",
            "h ost:x",
        ] {
            assert!(
                Repository::parse(text).is_err(),
                "{text:?} was read as {:?}",
                Repository::parse(text)
            );
        }
    }

    #[test]
    fn names_the_scheduler_or_a_metadata_service_uses() {
        for name in [
            "localhost",
            "a.localhost",
            "a.b.localhost",
            "metadata",
            "metadata.google.internal",
            "instance-data",
            "instance-data.ec2.internal",
            "metadata.tencentyun.com",
        ] {
            assert!(denied_name(name).is_some(), "{name}");
        }
        for name in [
            "localhost.example.com",
            "xlocalhost",
            "metadata.example",
            ".localhost",
        ] {
            assert_eq!(denied_name(name), None, "{name}");
        }
    }
}
