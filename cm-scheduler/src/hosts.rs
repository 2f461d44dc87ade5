//! The names the status page answers to: its guard against DNS rebinding.
//!
//! A web page served as `rebind.attacker.example` can have that name resolve to `127.0.0.1` a
//! moment later; the browser then sends the page's requests, same-origin in its eyes, to the
//! scheduler's loopback listener, with `Host: rebind.attacker.example`. Answering only the names
//! the page is really served at ([`AllowedHosts`]) refuses those requests before any handler
//! runs, with or without a token: an attacker's name is never one of them.
//!
//! The probes and `/metrics` are not guarded (see [`crate::http`]): they are scraped by address
//! or by a service's name, carry no routine's data, and change nothing.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// One admitted name: a DNS name or an address (IPv6 in brackets), lower case, without a
/// trailing dot, and the port it is admitted on (any when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Admitted {
    name: String,
    port: Option<u16>,
}

impl fmt::Display for Admitted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.port {
            Some(port) => write!(f, "{}:{port}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// The `Host` values the page answers: every other is refused (421) before any handler runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts(Vec<Admitted>);

/// The port a `Host` without one names: the page is served over plain HTTP.
const HTTP_PORT: u16 = 80;

impl AllowedHosts {
    /// What a page listening on `listen` answers without being told more: the listen address
    /// itself (`127.0.0.1:9464`) and, when it is a loopback or unspecified address (which
    /// answers on loopback too), `localhost`, `127.0.0.1` and `[::1]`, each with the listen
    /// port. An address is never a name an attacker's DNS can move, so none of these can be
    /// rebound.
    pub fn for_listen(listen: SocketAddr) -> AllowedHosts {
        let port = Some(listen.port());
        let mut admitted = vec![Admitted {
            name: address_name(listen.ip()),
            port,
        }];
        if listen.ip().is_loopback() || listen.ip().is_unspecified() {
            for name in ["localhost", "127.0.0.1", "[::1]"] {
                admitted.push(Admitted {
                    name: name.into(),
                    port,
                });
            }
        }
        let mut hosts = AllowedHosts(Vec::new());
        for one in admitted {
            hosts.push(one);
        }
        hosts
    }

    /// The loopback names on any port: what a page built without a listen address answers
    /// (the library's default; the binary uses [`AllowedHosts::for_listen`]).
    pub fn loopback() -> AllowedHosts {
        AllowedHosts(
            ["localhost", "127.0.0.1", "[::1]"]
                .into_iter()
                .map(|name| Admitted {
                    name: name.into(),
                    port: None,
                })
                .collect(),
        )
    }

    /// Admits `entry` as well: a name or address the operator serves the page at (`run
    /// --allowed-host`), as `NAME` (any port, or none: the name behind a reverse proxy) or
    /// `NAME:PORT` (that port only). An IPv6 address is written in brackets (`[fd00::1]:9464`).
    /// Refused: anything else, such as a URL, a path, a wildcard or an empty name.
    pub fn admit(&mut self, entry: &str) -> Result<(), String> {
        let (name, port) = split(entry.trim()).ok_or_else(|| {
            format!(
                "--allowed-host {entry:?} is not a host name or address with an optional port \
                 (like cm.example.com or cm.example.com:9464)"
            )
        })?;
        self.push(Admitted { name, port });
        Ok(())
    }

    fn push(&mut self, admitted: Admitted) {
        if !self.0.contains(&admitted) {
            self.0.push(admitted);
        }
    }

    /// Whether a request's `Host` (its value as sent) is one of these.
    pub fn admits(&self, host: &str) -> bool {
        let Some((name, port)) = split(host.trim()) else {
            return false;
        };
        let port = port.unwrap_or(HTTP_PORT);
        self.0
            .iter()
            .any(|a| a.name == name && a.port.is_none_or(|p| p == port))
    }
}

impl fmt::Display for AllowedHosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, admitted) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{admitted}")?;
        }
        Ok(())
    }
}

/// An address as a `Host` names it: IPv6 in brackets.
fn address_name(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

/// `host[:port]` as a name (lower case, no trailing dot; an IPv6 address in brackets, in its
/// canonical form) and a port, or `None` when it is neither a DNS name, an IPv4 address nor a
/// bracketed IPv6 address, or its port is not a number.
fn split(text: &str) -> Option<(String, Option<u16>)> {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let v6: std::net::Ipv6Addr = inside.parse().ok()?;
        let port = match after {
            "" => None,
            _ => Some(after.strip_prefix(':')?),
        };
        (format!("[{v6}]"), port)
    } else {
        let (host, port) = match text.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        };
        let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
        let label = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if host.is_empty() || host.len() > 253 || !host.split('.').all(label) {
            return None;
        }
        (host, port)
    };
    let port = match port {
        None => None,
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            Some(digits.parse().ok()?)
        }
        Some(_) => return None,
    };
    Some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loopback_listener_answers_its_address_and_the_loopback_names_on_its_port() {
        let hosts = AllowedHosts::for_listen("127.0.0.1:9464".parse().unwrap());
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "LOCALHOST:9464",
            "localhost.:9464",
            "[::1]:9464",
            "[0:0:0:0:0:0:0:1]:9464",
        ] {
            assert!(hosts.admits(host), "{host}");
        }
        for host in [
            "rebind.attacker.example:9464",
            "rebind.attacker.example",
            "localhost.attacker.example:9464",
            "localhost:9465",
            "localhost",
            "127.0.0.1",
            "127.0.0.1:9464:1",
            "127.0.0.1:",
            "127.0.0.1:+9464",
            "[::1]",
            "[::1]9464",
            "",
            "user@localhost:9464",
        ] {
            assert!(!hosts.admits(host), "{host}");
        }
        assert_eq!(
            hosts.to_string(),
            "127.0.0.1:9464, localhost:9464, [::1]:9464"
        );
    }

    #[test]
    fn an_other_listener_answers_its_address_and_what_the_operator_admits() {
        let mut hosts = AllowedHosts::for_listen("10.0.0.5:8080".parse().unwrap());
        assert!(hosts.admits("10.0.0.5:8080"));
        assert!(!hosts.admits("localhost:8080"));
        assert!(!hosts.admits("cm.example.com"));
        hosts.admit("CM.example.com.").unwrap();
        hosts.admit("ops.example.com:8080").unwrap();
        hosts.admit("[FD00::1]:8080").unwrap();
        for host in [
            "cm.example.com",
            "cm.example.com:443",
            "ops.example.com:8080",
            "[fd00::1]:8080",
        ] {
            assert!(hosts.admits(host), "{host}");
        }
        assert!(!hosts.admits("ops.example.com"));
        assert!(!hosts.admits("ops.example.com:9000"));
        for bad in [
            "",
            "*",
            "*.example.com",
            "http://cm.example.com",
            "cm.example.com/",
            "cm example",
            "cm.example.com:http",
            "fd00::1",
            "[fd00::1",
            "cm..example.com",
        ] {
            assert!(hosts.admit(bad).is_err(), "{bad:?}");
        }
        // An unspecified address answers on loopback too.
        let any = AllowedHosts::for_listen("0.0.0.0:9464".parse().unwrap());
        assert!(any.admits("localhost:9464"));
        assert!(!any.admits("rebind.attacker.example:9464"));
        // Port 80 is the one a Host without a port names.
        let eighty = AllowedHosts::for_listen("127.0.0.1:80".parse().unwrap());
        assert!(eighty.admits("localhost"));
    }
}
