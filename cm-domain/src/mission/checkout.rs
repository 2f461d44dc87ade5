//! What a mission checks out: its `repository` and its `ref`.
//!
//! A repository is read once whatever its form ([`Repository::parse`]); its host is checked
//! against the addresses and names no mission may reach before its scheme is looked at, and it
//! never carries credentials. A ref follows `git check-ref-format` and can never reach git as an
//! option.

use super::{MissionError, refuse};
use crate::repository::{Host, Repository, denied_address, denied_name};

/// The most characters of `repository`.
pub const MAX_REPOSITORY_CHARS: usize = 2048;
/// The most bytes of `ref` (git allows longer; no real branch or tag comes near it).
pub const MAX_REF_BYTES: usize = 255;

/// `https://host/path`, `ssh://[user@]host[:port]/path` or `user@host:path`, split by
/// [`Repository::parse`]. Never a local path, `file://`, `git://` or another transport (`ext::`
/// runs a command), never a password in the URL or a user in an `https://` one (credentials are
/// the operator's, and a routine's payload is shown to whoever lists routines), never a host or
/// user that a client could read as an option (`-oProxyCommand=…`), and never an address
/// [`denied_address`] refuses or a name [`denied_name`] refuses, whatever the form: the host is
/// checked before the scheme. Returns the host.
pub(super) fn check_repository(repository: &str) -> Result<Host, MissionError> {
    let field = "repository";
    if repository.chars().count() > MAX_REPOSITORY_CHARS {
        return Err(refuse(
            field,
            format!("is longer than {MAX_REPOSITORY_CHARS} characters"),
        ));
    }
    if repository
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(refuse(
            field,
            "must not contain spaces or control characters",
        ));
    }
    let parsed = Repository::parse(repository).map_err(|why| refuse(field, why))?;
    let host = parsed.host().clone();
    let denied = match &host {
        Host::Address(ip) => denied_address(*ip),
        Host::Name(name) => denied_name(name),
    };
    if let Some(why) = denied {
        return Err(refuse(
            field,
            format!("host {host} is {why}; missions may not reach it"),
        ));
    }
    match parsed.scheme() {
        None | Some("ssh") => {}
        Some("https") if parsed.user().is_some() => {
            return Err(refuse(
                field,
                "must not carry credentials; they are operator configuration",
            ));
        }
        Some("https") => {}
        Some(other) => {
            return Err(refuse(
                field,
                format!("scheme {other:?} is not allowed (https://, ssh:// or user@host:path)"),
            ));
        }
    }
    if parsed.path().trim_matches('/').is_empty() {
        return Err(refuse(field, "must name a repository path"));
    }
    Ok(host)
}

/// The rules of `git check-ref-format`, and no leading `-` (it would reach git as an option).
pub(super) fn check_ref(git_ref: &str) -> Result<(), MissionError> {
    let bad = |reason: &str| Err(refuse("ref", format!("{git_ref:?} {reason}")));
    if git_ref.is_empty() {
        return bad("is empty");
    }
    if git_ref.len() > MAX_REF_BYTES {
        return bad(&format!("is longer than {MAX_REF_BYTES} bytes"));
    }
    if git_ref.starts_with('-') {
        return bad("must not start with -");
    }
    if let Some(c) = git_ref
        .chars()
        .find(|&c| c.is_control() || c == ' ' || "~^:?*[\\".contains(c))
    {
        return bad(&format!("contains {c:?}, which git refs cannot hold"));
    }
    if git_ref == "@" || git_ref.contains("..") || git_ref.contains("@{") {
        return bad("is not a valid git ref (\"@\", \"..\" and \"@{\" are not allowed)");
    }
    if git_ref.starts_with('/') || git_ref.ends_with('/') || git_ref.ends_with('.') {
        return bad("must not start or end with / or end with .");
    }
    for component in git_ref.split('/') {
        if component.is_empty() || component.starts_with('.') || component.ends_with(".lock") {
            return bad("has an empty component, one starting with ., or one ending with .lock");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mission::Mission;
    use crate::mission::testing::{accepted, mission, refused};

    #[test]
    fn repositories() {
        for ok in [
            "https://git.example.com/team/repo.git",
            "https://git.example.com:8443/team/repo",
            "ssh://git@git.example.com/team/repo.git",
            "ssh://git@git.example.com:2222/team/repo.git",
            "git@git.example.com:team/repo.git",
            "deploy@git.example.com:team/repo.git",
            "root@host:repo",
            "https://example.invalid/r.git",
            "https://10.0.0.5/team/r.git",
            "ssh://git@[2001:db8::1]/team/r.git",
            "ssh://git@[2001:db8::1%25eth0]:22/team/r.git",
            "git@[2001:db8::1]:team/r.git",
            "ssh://deploy-bot_1@git.example.com/r.git",
            "https://localhost.example.com/r.git",
            "https://127.0.0.1.nip.io/r.git",
            "https://git.example.com./r.git",
        ] {
            accepted(&format!(r#"{{"repository": "{ok}", "task": "t"}}"#));
        }
        for (repository, host) in [
            ("https://Git.Example.COM/r.git", "git.example.com"),
            ("git@git.example.com:r.git", "git.example.com"),
            ("https://GIT.example.com./r.git", "git.example.com"),
            ("ssh://git@g%69t.example.com/r.git", "git.example.com"),
            ("https://10.1/r.git", "10.0.0.1"),
            ("ssh://git@[2001:DB8::1]/r.git", "2001:db8::1"),
        ] {
            let m = accepted(&format!(r#"{{"repository": "{repository}", "task": "t"}}"#));
            assert_eq!(m.repository_host(), host, "{repository}");
        }
        for bad in [
            "",
            "/srv/git/repo.git",
            "./repo",
            "file:///srv/git/repo.git",
            "http://git.example.com/repo.git",
            "git://git.example.com/repo.git",
            "ftp://git.example.com/repo.git",
            "ext::sh -c touch% /tmp/pwned",
            "https://user:secret@git.example.com/repo.git",
            "https://token@git.example.com/repo.git",
            "ssh://git:pw@git.example.com/repo.git",
            "https://git.example.com/",
            "https:///repo.git",
            "git@-oProxyCommand=touch:x",
            "git@host",
            "git@host:",
            "git@host:-x",
            "host:repo",
            "https://git.example.com/re po",
            "https://git.example.com/r.git?x=1",
            "https://git.example.com/r.git#main",
            "https://git.example.com\\\\@other.example/r.git",
            // A user or host a client could read as an option.
            "ssh://-oProxyCommand=touch%20x@git.example.com/r.git",
            "ssh://-x@git.example.com/r.git",
            "ssh://a%20b@git.example.com/r.git",
            "ssh://%2Dx@git.example.com/r.git",
            "ssh://git@-oProxyCommand=x/r.git",
            // Hosts no client reads the same way.
            "https://1.2.3.08/r.git",
            "https://git.example.0x1/r.git",
            "https://a..b/r.git",
            "https://%E2%93%9Bocalhost/r.git",
        ] {
            refused(
                &format!(r#"{{"repository": "{bad}", "task": "t"}}"#),
                "repository",
            );
        }
        let long = format!("https://h.example/{}", "a".repeat(MAX_REPOSITORY_CHARS));
        refused(
            &format!(r#"{{"repository": "{long}", "task": "t"}}"#),
            "repository",
        );
        refused(r#"{"repository": 7, "task": "t"}"#, "repository");
        refused(
            r#"{"repository": "https://h.example/a\u0000b", "task": "t"}"#,
            "repository",
        );
    }

    /// Every form of a host a mission may never reach, in every URL form: each refused, its
    /// error naming why. The review reproduced the `ssh://` ones as created.
    #[test]
    fn every_form_of_a_denied_host_is_refused_whatever_the_scheme() {
        const LOOPBACK: &str = "a loopback address";
        const UNSPECIFIED: &str = "an unspecified address";
        const LINK_LOCAL: &str = "a link-local address";
        const METADATA: &str = "metadata service";
        const OWN_HOST: &str = "the scheduler's own host or a metadata service";
        let cases = [
            // The issue's ssh:// cases.
            ("ssh://git@127.0.0.1:5432/r.git", LOOPBACK),
            ("ssh://git@0x7f000001:5432/r.git", LOOPBACK),
            ("ssh://git@127.1:5432/r.git", LOOPBACK),
            ("ssh://git@0.0.0.0:5432/r.git", UNSPECIFIED),
            ("ssh://git@169.254.169.254/latest", METADATA),
            // Every IPv4 notation inet_aton reads, in every form.
            ("ssh://git@2130706433/r.git", LOOPBACK),
            ("ssh://git@017700000001/r.git", LOOPBACK),
            ("ssh://git@0x7f.1/r.git", LOOPBACK),
            ("ssh://git@0177.0.0.1/r.git", LOOPBACK),
            ("ssh://git@0x7f.0.0.0x1/r.git", LOOPBACK),
            ("ssh://git@127.0.1/r.git", LOOPBACK),
            ("ssh://git@127.0.0.1./r.git", LOOPBACK),
            ("ssh://git@127.0.0.%31/r.git", LOOPBACK),
            ("ssh://git@%31%32%37.1/r.git", LOOPBACK),
            ("ssh://git@[127.0.0.1]:22/r.git", LOOPBACK),
            ("ssh://127.0.0.1/r.git", LOOPBACK),
            ("ssh://127.0.0.1:22/r.git", LOOPBACK),
            ("ssh://0/r.git", UNSPECIFIED),
            ("ssh://0x0/r.git", UNSPECIFIED),
            ("ssh://git@0xa9fea9fe/latest", METADATA),
            ("ssh://git@169.254.43518/latest", METADATA),
            ("ssh://git@0251.0376.0251.0376/latest", METADATA),
            ("ssh://git@169.254.0.23/r.git", LINK_LOCAL),
            ("ssh://git@100.100.100.200/latest", METADATA),
            ("ssh://git@255.255.255.255/r.git", UNSPECIFIED),
            ("https://127.0.0.1/r.git", LOOPBACK),
            ("https://127.1/r.git", LOOPBACK),
            ("https://2130706433/r.git", LOOPBACK),
            ("https://0x7f000001/r.git", LOOPBACK),
            ("https://0X7F000001:443/r.git", LOOPBACK),
            ("https://127.0.0.1.:8443/r.git", LOOPBACK),
            ("https://0.0.0.0/r.git", UNSPECIFIED),
            ("https://0/r.git", UNSPECIFIED),
            ("https://169.254.169.254/latest/meta-data", METADATA),
            ("https://100.100.100.200/latest", METADATA),
            ("https://192.0.0.192/latest", METADATA),
            ("git://127.0.0.1/r.git", LOOPBACK),
            ("git://0x7f000001/r.git", LOOPBACK),
            ("git://169.254.169.254/latest", METADATA),
            ("http://127.1/r.git", LOOPBACK),
            ("file://127.0.0.1/r.git", LOOPBACK),
            ("git+ssh://git@127.1/r.git", LOOPBACK),
            ("git@127.0.0.1:r.git", LOOPBACK),
            ("git@127.1:r.git", LOOPBACK),
            ("git@0x7f000001:r.git", LOOPBACK),
            ("git@2130706433:r.git", LOOPBACK),
            ("deploy@127.0.0.1.:r.git", LOOPBACK),
            ("git@0.0.0.0:r.git", UNSPECIFIED),
            ("git@169.254.169.254:r.git", METADATA),
            ("git@[127.0.0.1]:r.git", LOOPBACK),
            // IPv6: loopback, unspecified, link-local with zones, metadata, and IPv4 inside.
            ("https://[::1]/r.git", LOOPBACK),
            ("ssh://git@[::1]/r.git", LOOPBACK),
            ("ssh://git@[::1]:5432/r.git", LOOPBACK),
            ("ssh://git@[0:0:0:0:0:0:0:1]/r.git", LOOPBACK),
            ("ssh://git@[::1%25lo]/r.git", LOOPBACK),
            ("git@[::1]:r.git", LOOPBACK),
            ("https://[::]/r.git", UNSPECIFIED),
            ("ssh://git@[::]/r.git", UNSPECIFIED),
            ("https://[fe80::1]/r.git", LINK_LOCAL),
            ("ssh://git@[fe80::1%25eth0]/r.git", LINK_LOCAL),
            ("ssh://git@[fe80::1%eth0]/r.git", LINK_LOCAL),
            ("git@[fe80::1%eth0]:r.git", LINK_LOCAL),
            ("ssh://git@[FEBF::1]/r.git", LINK_LOCAL),
            ("https://[fd00:ec2::254]/latest", METADATA),
            ("ssh://git@[fd00:ec2::254]/latest", METADATA),
            ("https://[::ffff:127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[::ffff:127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[::ffff:7f00:1]/r.git", LOOPBACK),
            ("ssh://git@[::127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[::ffff:0:127.0.0.1]/r.git", LOOPBACK),
            ("ssh://git@[64:ff9b::169.254.169.254]/latest", METADATA),
            ("ssh://git@[::ffff:169.254.169.254]/latest", METADATA),
            ("ssh://git@[::ffff:0.0.0.0]/r.git", UNSPECIFIED),
            // Names of the scheduler's own host and of metadata services, however written.
            ("https://localhost/r.git", OWN_HOST),
            ("https://LOCALHOST./r.git", OWN_HOST),
            ("https://git.localhost/r.git", OWN_HOST),
            ("ssh://git@localhost/r.git", OWN_HOST),
            ("ssh://git@localhost.:5432/r.git", OWN_HOST),
            ("ssh://git@l%6Fcalhost/r.git", OWN_HOST),
            ("ssh://git@[localhost]/r.git", OWN_HOST),
            ("git@localhost:r.git", OWN_HOST),
            ("git@LocalHost.:r.git", OWN_HOST),
            (
                "https://metadata.google.internal/computeMetadata/v1",
                OWN_HOST,
            ),
            ("ssh://git@metadata.google.internal./x", OWN_HOST),
            ("git@instance-data:r.git", OWN_HOST),
            ("https://metadata/r.git", OWN_HOST),
        ];
        for (repository, why) in cases {
            let err =
                Mission::from_json(&format!(r#"{{"repository": "{repository}", "task": "t"}}"#))
                    .map(|m| panic!("{repository} was accepted, host {:?}", m.host()))
                    .unwrap_err();
            assert_eq!(err.field(), Some("repository"), "{repository}: {err}");
            assert!(err.to_string().contains(why), "{repository}: {err}");
        }
        // Percent-encoding an address's digits does not change what the check reads.
        let err = Mission::from_json(
            r#"{"repository": "ssh://git@[fd00:ec2::25%34]/latest", "task": "t"}"#,
        )
        .unwrap_err();
        assert!(err.to_string().contains("fd00:ec2::254"), "{err}");
    }

    #[test]
    fn refs() {
        for ok in [
            "main",
            "v1.2.3",
            "release/2026.03",
            "feature/a-b_c",
            "0123456789abcdef0123456789abcdef01234567",
        ] {
            accepted(&mission(&format!(r#""ref": "{ok}""#)));
        }
        for bad in [
            "",
            "-x",
            "--upload-pack=touch",
            "a..b",
            "a b",
            "a~1",
            "a^",
            "a:b",
            "a?",
            "a*",
            "a[",
            "a\\\\b",
            "@",
            "a@{1}",
            "/a",
            "a/",
            "a.",
            "a//b",
            ".a",
            "a/.b",
            "a.lock",
            "a/b.lock/c",
        ] {
            refused(&mission(&format!(r#""ref": "{bad}""#)), "ref");
        }
        refused(&mission(&format!(r#""ref": "{}""#, "a".repeat(256))), "ref");
        refused(&mission(r#""ref": ["main"]"#), "ref");
        refused(&mission(r#""ref": "a\u0001""#), "ref");
    }
}
