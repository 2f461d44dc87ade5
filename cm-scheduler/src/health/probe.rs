//! The probe `cm-scheduler health` runs: asks a running scheduler's `/readyz` over plain HTTP/1.1 on a raw TCP
//! connection, for a container's HEALTHCHECK (the image holds no curl, no shell).
//!
//! It succeeds only on a `200`; anything else is one line naming the reason: the body of a
//! `503` (the scheduler's own words), a refused connection, a timeout.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::flags::HealthArgs;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The most of an answer read: `/readyz` answers a line or two.
const MAX_ANSWER: u64 = 64 * 1024;

/// Asks `/readyz`; `Err` is the one line saying why the scheduler is not ready.
pub async fn probe(args: HealthArgs) -> Result<(), String> {
    let Some(listen) = args.listen else {
        return Err(
            "no address to ask: give --listen ADDR or set CM_LISTEN to the address \
                    `run --listen` serves (run serves nothing without it; `cargo xtask demo` \
                    serves 127.0.0.1:9464)"
                .into(),
        );
    };
    let addr = probe_address(listen);
    match tokio::time::timeout(args.timeout, ask(addr)).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer from {addr} within {}",
            humantime::format_duration(args.timeout)
        )),
    }
}

/// Where to connect for a listen address: an unspecified one is reached on loopback.
fn probe_address(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

async fn ask(addr: SocketAddr) -> Result<(), String> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::ConnectionRefused {
            format!("connection refused at {addr}")
        } else {
            format!("cannot connect to {addr}: {e}")
        }
    })?;
    let request = format!(
        "GET /readyz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nUser-Agent: cm-scheduler-health\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("cannot ask {addr}: {e}"))?;
    let mut answer = Vec::new();
    (&mut stream)
        .take(MAX_ANSWER)
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("reading the answer of {addr}: {e}"))?;
    verdict(addr, &answer)
}

/// The status line's code decides; the body of anything but a 200 is the reason.
///
/// The answer is taken as bytes, whatever they are: a chunk may end inside a character and the
/// body need not be UTF-8. What is printed is one line of at most [`MAX_REASON`] characters.
fn verdict(addr: SocketAddr, answer: &[u8]) -> Result<(), String> {
    let (head, body) = match find(answer, b"\r\n\r\n") {
        Some(at) => (&answer[..at], &answer[at + 4..]),
        None => (answer, &[][..]),
    };
    let status = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let code = status
        .strip_prefix(b"HTTP/1.")
        .and_then(|rest| rest.get(2..))
        .map(String::from_utf8_lossy)
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u16>().ok())
        .ok_or_else(|| {
            format!(
                "{addr} did not answer HTTP (status line \"{}\")",
                one_line(status)
            )
        })?;
    if code == 200 {
        return Ok(());
    }
    let reason = one_line(&unchunk(head, body));
    if reason.is_empty() {
        Err(format!("not ready: /readyz at {addr} answered {code}"))
    } else {
        Err(format!("not ready ({code}): {reason}"))
    }
}

/// The most characters of an answer's text printed.
const MAX_REASON: usize = 300;

/// `bytes` as one line of text: invalid UTF-8 replaced, control characters and runs of
/// whitespace made one space, cut to [`MAX_REASON`] characters (an ellipsis marks the cut).
fn one_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let words = text
        .split(|c: char| c.is_whitespace() || c.is_control())
        .filter(|w| !w.is_empty());
    let mut line = String::new();
    for word in words {
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
        if line.chars().count() > MAX_REASON {
            let mut cut: String = line.chars().take(MAX_REASON).collect();
            cut.push('…');
            return cut;
        }
    }
    line
}

/// Where `needle` first occurs in `haystack`.
fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A chunked body's data (axum sends a short `String` with a length, but a proxy may chunk it),
/// as bytes: a chunk's size counts bytes, so a chunk may end inside a character. A chunk cut
/// short by the read's bound gives what was read of it.
fn unchunk(head: &[u8], body: &[u8]) -> Vec<u8> {
    let chunked = head.split(|&b| b == b'\n').any(|line| {
        let line = String::from_utf8_lossy(line).to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    if !chunked {
        return body.to_vec();
    }
    let mut data = Vec::new();
    let mut rest = body;
    while let Some(at) = find(rest, b"\r\n") {
        let line = String::from_utf8_lossy(&rest[..at]);
        let Ok(size) = usize::from_str_radix(line.split(';').next().unwrap_or("").trim(), 16)
        else {
            break;
        };
        let after = &rest[at + 2..];
        if size == 0 {
            break;
        }
        let taken = size.min(after.len());
        data.extend_from_slice(&after[..taken]);
        rest = &after[taken..];
        while let Some(next) = rest.strip_prefix(b"\r\n") {
            rest = next;
        }
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::collection::vec;
    use proptest::prelude::*;
    use proptest::test_runner::TestCaseError;

    fn addr() -> SocketAddr {
        "127.0.0.1:8080".parse().unwrap()
    }

    #[test]
    fn a_200_is_ready_and_a_503_gives_its_body() {
        assert_eq!(
            verdict(addr(), b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready"),
            Ok(())
        );
        assert_eq!(
            verdict(
                addr(),
                b"HTTP/1.1 503 Service Unavailable\r\n\r\ndatabase unreachable\n"
            ),
            Err("not ready (503): database unreachable".to_string())
        );
        assert!(verdict(addr(), b"SSH-2.0-OpenSSH\r\n").is_err());
    }

    #[test]
    fn a_chunked_body_is_read_back() {
        let answer = b"HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nlate\r\n0\r\n\r\n";
        assert_eq!(
            verdict(addr(), answer),
            Err("not ready (503): late".to_string())
        );
    }

    #[test]
    fn a_chunk_ending_inside_a_character_is_read_back_whole() {
        // "é" is two bytes, each in a chunk of its own.
        let answer = b"HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\n\r\n\
                       3\r\ncaf\r\n1\r\n\xc3\r\n1\r\n\xa9\r\n0\r\n\r\n";
        assert_eq!(
            verdict(addr(), answer),
            Err("not ready (503): café".to_string())
        );
    }

    #[test]
    fn a_long_reason_is_cut_to_one_short_line() {
        let mut answer = b"HTTP/1.1 503 No\r\n\r\n".to_vec();
        answer.extend(b"word\x1b[2J\n".repeat(10_000));
        let Err(line) = verdict(addr(), &answer) else {
            panic!("a 503 is not ready");
        };
        let reason = line.strip_prefix("not ready (503): ").unwrap();
        assert_eq!(reason.chars().count(), MAX_REASON + 1, "{reason}");
        assert!(
            reason.ends_with('…') && !reason.contains('\x1b'),
            "{reason}"
        );
    }

    /// `body` sent chunked, cut into chunks after each of `cuts` (byte offsets, any order).
    fn chunked(code: u16, body: &[u8], cuts: &[usize]) -> Vec<u8> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (body.len() + 1)).collect();
        at.extend([0, body.len()]);
        at.sort_unstable();
        at.dedup();
        let mut answer =
            format!("HTTP/1.1 {code} X\r\nTransfer-Encoding: chunked\r\n\r\n").into_bytes();
        for piece in at.windows(2) {
            let chunk = &body[piece[0]..piece[1]];
            answer.extend(format!("{:x}\r\n", chunk.len()).into_bytes());
            answer.extend(chunk);
            answer.extend(b"\r\n");
        }
        answer.extend(b"0\r\n\r\n");
        answer
    }

    /// What is printed of a refusal: one line, short, whatever the answer held.
    fn printable(verdict: Result<(), String>) -> Result<(), TestCaseError> {
        if let Err(line) = verdict {
            prop_assert!(!line.chars().any(char::is_control), "{line:?}");
            // The reason, and the words around it.
            prop_assert!(line.chars().count() <= MAX_REASON + 64, "{line:?}");
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn any_bytes_make_a_verdict_and_never_a_panic(answer in vec(any::<u8>(), 0..2048)) {
            printable(verdict(addr(), &answer))?;
            let mut after_head = b"HTTP/1.1 503 X\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
            after_head.extend(&answer);
            printable(verdict(addr(), &after_head))?;
        }

        #[test]
        fn any_body_in_any_chunks_is_read_back(
            code in 201u16..600,
            body in vec(any::<u8>(), 0..1024),
            cuts in vec(any::<usize>(), 0..16),
        ) {
            let answer = chunked(code, &body, &cuts);
            let seen = verdict(addr(), &answer);
            printable(seen.clone())?;
            // However it was chunked, the reason is the body's, as one line.
            let reason = one_line(&body);
            let expected = if reason.is_empty() {
                format!("not ready: /readyz at {} answered {code}", addr())
            } else {
                format!("not ready ({code}): {reason}")
            };
            prop_assert_eq!(seen, Err(expected));
        }

        #[test]
        fn text_in_any_chunks_is_read_back_as_its_words(
            text in "[a-zé€😀 \n\t]{0,200}",
            cuts in vec(any::<usize>(), 0..16),
        ) {
            let answer = chunked(503, text.as_bytes(), &cuts);
            let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let seen = verdict(addr(), &answer);
            if words.is_empty() {
                prop_assert!(seen.is_err());
            } else {
                prop_assert_eq!(seen, Err(format!("not ready (503): {words}")));
            }
        }
    }

    #[test]
    fn an_unspecified_address_is_asked_on_loopback() {
        assert_eq!(
            probe_address("0.0.0.0:9".parse().unwrap()),
            "127.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            probe_address("[::]:9".parse().unwrap()),
            "[::1]:9".parse().unwrap()
        );
    }
}
