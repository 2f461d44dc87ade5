//! The names and settings a Job is built from, checked as the Kubernetes API server checks them:
//! Job names from occurrence keys, DNS labels, label values, quantities and numeric users.

use super::*;

/// The Job name of the occurrence whose key is `key`: the key itself when it is a valid DNS
/// label (every key cm makes is: `cm-<32 hex>-<micros>`, at most 56 characters), else `cm-` and
/// 40 hex digits of its SHA-256, so any key maps to a valid name, the same every time.
pub fn job_name(key: &str) -> String {
    if is_dns_label(key) {
        key.to_owned()
    } else {
        let digest = Sha256::digest(key.as_bytes());
        let hex: String = digest.iter().take(20).map(|b| format!("{b:02x}")).collect();
        format!("cm-{hex}")
    }
}

/// A DNS-1123 label: 1 to 63 lowercase alphanumerics or `-`, starting and ending with an
/// alphanumeric. Kubernetes requires it of a Job's name (its pods carry it as a label value).
pub fn is_dns_label(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.iter().all(|&b| alnum(b) || b == b'-')
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
}

/// A Kubernetes label value: empty, or at most 63 alphanumerics, `-`, `_` and `.`, starting and
/// ending with an alphanumeric.
pub fn is_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    bytes.is_empty()
        || (bytes.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(b))
            && bytes[0].is_ascii_alphanumeric()
            && bytes[bytes.len() - 1].is_ascii_alphanumeric())
}

/// The operator's settings checked as the API server would check the Job, so a setting it
/// would refuse stops `run` at start (naming the key) instead of failing every occurrence;
/// returns the numeric user.
pub(super) fn checked_settings(
    config: &MissionConfig,
) -> Result<Option<(i64, Option<i64>)>, KubernetesSetupError> {
    let k8s = &config.kubernetes;
    let refuse = |key: &str, why: String| {
        Err(KubernetesSetupError::Config(format!(
            "mission config \"kubernetes\".{key}: {why}"
        )))
    };
    if !is_dns_label(&k8s.namespace) {
        return refuse(
            "namespace",
            format!(
                "{:?} is not a DNS-1123 label (at most 63 lowercase letters, digits and '-', \
                 starting and ending with a letter or digit)",
                k8s.namespace
            ),
        );
    }
    if k8s.backoff_limit < 0 {
        return refuse(
            "backoff_limit",
            format!("must be 0 or more, not {}", k8s.backoff_limit),
        );
    }
    if k8s.ttl_seconds_after_finished < 0 {
        return refuse(
            "ttl_seconds_after_finished",
            format!("must be 0 or more, not {}", k8s.ttl_seconds_after_finished),
        );
    }
    if k8s.active_deadline_seconds < 1 {
        return refuse(
            "active_deadline_seconds",
            format!("must be 1 or more, not {}", k8s.active_deadline_seconds),
        );
    }
    if let Some(account) = &k8s.service_account
        && !is_dns_subdomain(account)
    {
        return refuse(
            "service_account",
            format!("{account:?} is not a DNS-1123 subdomain"),
        );
    }
    for (key, value) in [("cpu", &k8s.cpu), ("memory", &k8s.memory)] {
        if let Some(value) = value
            && !is_quantity(value)
        {
            return refuse(
                key,
                format!(
                    "{value:?} is not a Kubernetes quantity (a non-negative number with an \
                     optional suffix: 500m, 1.5, 2Gi, 1e3)"
                ),
            );
        }
    }
    numeric_user(config.user.as_deref())
}

/// A Kubernetes resource quantity as `resource.ParseQuantity` reads it, not negative: a decimal
/// number (`1`, `1.5`, `.5`, `5.`), then a binary suffix (`Ki` … `Ei`), a decimal one (`n`,
/// `u`, `m`, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal exponent (`e3`, `E-2`), or nothing.
pub fn is_quantity(text: &str) -> bool {
    let number = text.strip_prefix('+').unwrap_or(text);
    let digits_end = number
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(number.len());
    let (value, suffix) = number.split_at(digits_end);
    let has_digit = value.bytes().any(|b| b.is_ascii_digit());
    if !has_digit || value.matches('.').count() > 1 {
        return false;
    }
    const SUFFIXES: [&str; 16] = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E",
    ];
    if SUFFIXES.contains(&suffix) {
        return true;
    }
    // A decimal exponent: e or E, an optional sign, digits.
    let Some(exponent) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let exponent = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    !exponent.is_empty() && exponent.bytes().all(|b| b.is_ascii_digit())
}

/// A DNS-1123 subdomain: dot-separated DNS labels, at most 253 characters (a service account's
/// name).
fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// `uid[:gid]` as numbers: Kubernetes runs a container as a numeric user only.
pub(super) fn numeric_user(
    user: Option<&str>,
) -> Result<Option<(i64, Option<i64>)>, KubernetesSetupError> {
    let Some(user) = user else { return Ok(None) };
    let refuse = || {
        KubernetesSetupError::Config(format!(
            "the kubernetes mission backend runs a mission as a numeric user: \"user\" must be \
             uid or uid:gid, not {user:?}"
        ))
    };
    let number = |text: &str| text.parse::<i64>().ok().filter(|n| *n >= 0);
    match user.split_once(':') {
        None => Ok(Some((number(user).ok_or_else(refuse)?, None))),
        Some((uid, gid)) => Ok(Some((
            number(uid).ok_or_else(refuse)?,
            Some(number(gid).ok_or_else(refuse)?),
        ))),
    }
}
