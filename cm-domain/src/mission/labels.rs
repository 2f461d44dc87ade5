//! The routine's own labels (`labels`), and the keys runtimes and the controllers beside them read
//! as their own.
//!
//! A label follows Kubernetes' syntax (the strictest runtime), is never `cm.*` (cm sets those) and
//! never a key [`reserved_label`] names. The operator's `label_allow`
//! ([`super::MissionPolicy`]) narrows what is left; it never opens a reserved key.

use super::{MissionError, refuse};

/// The most entries in `labels`.
pub const MAX_LABELS: usize = 32;
/// The most characters of a label's name and of its value, as Kubernetes allows.
pub const MAX_LABEL_CHARS: usize = 63;

/// The prefix of the labels cm itself gives every mission.
pub const RESERVED_LABEL_PREFIX: &str = "cm.";

/// Label prefixes (the part before `/`) that runtimes and the controllers beside them read as
/// their own: each domain and every subdomain of it (`app.kubernetes.io`,
/// `nginx.ingress.kubernetes.io`, `sidecar.istio.io`). A key whose whole text starts with the
/// domain reversed (`com.docker.`, `io.kubernetes.`, Docker's style) is refused too.
pub const RESERVED_LABEL_DOMAINS: &[&str] = &[
    "kubernetes.io",
    "k8s.io",
    "docker.com",
    "docker.io",
    "dockerproject.org",
    "istio.io",
    "linkerd.io",
    "traefik.io",
    "containo.us",
    "konghq.com",
    "cilium.io",
    "openshift.io",
    "cattle.io",
    "prometheus.io",
    "cert-manager.io",
];

/// Starts of label keys that proxies, meshes and container tools read off a container or a pod
/// (`traefik.enable`, `caddy`, `istio-injection`, `linkerd.io/inject`,
/// `com.centurylinklabs.watchtower.enable`).
pub const RESERVED_LABEL_STARTS: &[&str] = &[
    "traefik",
    "caddy",
    "istio",
    "linkerd",
    "com.centurylinklabs.watchtower",
];

/// Kubernetes' label syntax (the strictest runtime): an optional DNS-subdomain prefix and `/`,
/// then a name of at most 63 characters; a value of at most 63. Both start and end alphanumeric
/// and hold only alphanumerics, `-`, `_` and `.`.
pub(super) fn check_label(name: &str, value: &str) -> Result<(), MissionError> {
    let field = format!("labels.{name}");
    let segment_ok = |s: &str, allow_empty: bool| {
        (allow_empty && s.is_empty())
            || (s.len() <= MAX_LABEL_CHARS
                && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                && s.ends_with(|c: char| c.is_ascii_alphanumeric())
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    };
    let (prefix, local) = match name.split_once('/') {
        Some((prefix, local)) => (Some(prefix), local),
        None => (None, name),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        p.len() <= 253
            && p.split('.').all(|part| {
                !part.is_empty()
                    && part
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            })
    });
    if !prefix_ok || !segment_ok(local, false) {
        return Err(refuse(
            field,
            "label names must be [prefix/]name: alphanumerics, -, _ and ., at most 63, \
             starting and ending alphanumeric",
        ));
    }
    if name.starts_with(RESERVED_LABEL_PREFIX) {
        return Err(refuse(field, "cm.* labels are set by cm itself"));
    }
    if let Some(reserved) = reserved_label(name) {
        return Err(refuse(
            field,
            format!("{reserved}: the runtime or a controller beside it reads it"),
        ));
    }
    if !segment_ok(value, true) {
        return Err(refuse(
            field,
            "label values must be at most 63 alphanumerics, -, _ and ., starting and ending \
             alphanumeric",
        ));
    }
    Ok(())
}

/// Why a label key is one the runtime or a controller beside it reads as its own, or `None`:
/// the keys Kubernetes sets on a Job's pods (`job-name`, `controller-uid`), a prefix of
/// [`RESERVED_LABEL_DOMAINS`] or a subdomain of one, a key starting with such a domain
/// reversed (`com.docker.`) or with one of [`RESERVED_LABEL_STARTS`].
pub fn reserved_label(key: &str) -> Option<String> {
    if matches!(key, "job-name" | "controller-uid") {
        return Some(format!("{key} is set by Kubernetes on a Job's pods"));
    }
    let prefix = key.split_once('/').map(|(prefix, _)| prefix);
    for domain in RESERVED_LABEL_DOMAINS {
        if let Some(prefix) = prefix
            && (prefix == *domain || prefix.ends_with(&format!(".{domain}")))
        {
            return Some(format!("{domain}/* and *.{domain}/* are reserved"));
        }
        let reversed: Vec<&str> = domain.rsplit('.').collect();
        let reversed = reversed.join(".");
        if key == reversed || key.starts_with(&format!("{reversed}.")) {
            return Some(format!("{reversed}.* is reserved"));
        }
    }
    RESERVED_LABEL_STARTS
        .iter()
        .find(|start| key.starts_with(*start))
        .map(|start| format!("{start}* is read by a proxy or a service mesh"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mission::MissionPolicy;
    use crate::mission::testing::{accepted, mission, refused};

    #[test]
    fn labels() {
        accepted(&mission(
            r#""labels": {"team": "platform", "a.b/c_d": "", "x": "A-1.b_2"}"#,
        ));
        for (labels, field) in [
            (r#"{"cm.routine-id": "x"}"#, "labels.cm.routine-id"),
            (r#"{"-team": "x"}"#, "labels.-team"),
            (r#"{"team": "-x"}"#, "labels.team"),
            (r#"{"team": "a b"}"#, "labels.team"),
            (r#"{"team": "a:b"}"#, "labels.team"),
            (r#"{"Bad_Prefix/x": "y"}"#, "labels.Bad_Prefix/x"),
            (r#"{"team": 3}"#, "labels.team"),
            (r#"{"": "x"}"#, "labels."),
        ] {
            refused(&mission(&format!(r#""labels": {labels}"#)), field);
        }
        // Keys a runtime, an ingress or proxy controller or a service mesh reads: refused
        // whatever the operator allows.
        for key in [
            "job-name",
            "controller-uid",
            "batch.kubernetes.io/job-name",
            "batch.kubernetes.io/controller-uid",
            "kubernetes.io/x",
            "node.kubernetes.io/x",
            "app.kubernetes.io/name",
            "nginx.ingress.kubernetes.io/rewrite-target",
            "k8s.io/x",
            "x.k8s.io/y",
            "io.kubernetes.pod.name",
            "com.docker.compose.project",
            "com.docker.stack.namespace",
            "io.docker.x",
            "org.dockerproject.x",
            "docker.io/x",
            "traefik.enable",
            "traefik.http.routers.r.rule",
            "traefik.io/x",
            "io.traefik.x",
            "caddy",
            "caddy.reverse_proxy",
            "istio-injection",
            "istio.io/rev",
            "sidecar.istio.io/inject",
            "security.istio.io/tlsMode",
            "linkerd.io/inject",
            "config.linkerd.io/skip-outbound-ports",
            "konghq.com/plugins",
            "io.cilium.x",
            "policy.cilium.io/x",
            "prometheus.io/scrape",
            "com.centurylinklabs.watchtower.enable",
        ] {
            assert!(reserved_label(key).is_some(), "{key}");
            refused(
                &mission(&format!(r#""labels": {{"{key}": "x"}}"#)),
                &format!("labels.{key}"),
            );
            // An allow list that would admit the key does not open it.
            let everything = MissionPolicy::new(None, Some(vec!["*".into()]), None).unwrap();
            assert!(everything.label_allow().contains(&"*"));
        }
        for key in [
            "example.com/job-name",
            "mykubernetes.io/a",
            "job-names",
            "routine/traefik.enable",
            "routine/istio-injection",
            "example.com/io.kubernetes.x",
            "dockerx.io/a",
        ] {
            assert_eq!(reserved_label(key), None, "{key}");
            accepted(&mission(&format!(r#""labels": {{"{key}": "x"}}"#)));
        }
        let long = "a".repeat(MAX_LABEL_CHARS + 1);
        refused(
            &mission(&format!(r#""labels": {{"t": "{long}"}}"#)),
            "labels.t",
        );
        let many: Vec<String> = (0..=MAX_LABELS)
            .map(|i| format!(r#""l{i}": "x""#))
            .collect();
        refused(
            &mission(&format!(r#""labels": {{{}}}"#, many.join(","))),
            "labels",
        );
    }
}
