//! The secret rules of a run's output beyond the structural ones of [`super::scrub_output`]
//! (URL passwords, `Authorization` values, `password=`-style and JSON secret members, PEM
//! private keys): tokens whose prefix and length give them away (GitHub's `ghp_…`, Stripe's
//! `sk_live_…`, Google's `AIza…`), and secrets where tools print them (a `.netrc` line,
//! `mysql -pX`, `curl -u user:pass`, an `.npmrc`'s `_authToken`, a token as a URL's user, a
//! Slack webhook's path).
//!
//! The table is cm's own, written from each format's documented prefix, alphabet and length;
//! it is not a copy of another project's rule set. A rule keeps what says which kind of secret
//! was there (the prefix, the key or the flag before it) and masks the rest, so `ghp_…` becomes
//! `ghp_***`. A rule is added with a test case of its own (`every_rule_masks_its_example`).
//!
//! The rules are compiled once, into one [`RegexSet`] that tells in one pass over the text
//! which rules match (none, for most output) and one [`Regex`] per rule that masks its matches.
//! Word boundaries (`\b`) are ASCII ones, so a text holding non-ASCII characters is still
//! searched by the fast engines.

use std::sync::LazyLock;

use regex::{Regex, RegexSet};

/// One rule: what it matches is replaced by its mask.
pub(super) struct Rule {
    /// A short name, for the reader and the tests.
    pub(super) id: &'static str,
    /// The pattern (the `regex` crate's syntax).
    pub(super) pattern: &'static str,
    /// What a match becomes: `${1}`, `${2}` name the pattern's kept groups.
    pub(super) mask: &'static str,
}

const fn rule(id: &'static str, pattern: &'static str, mask: &'static str) -> Rule {
    Rule { id, pattern, mask }
}

/// The rules, in the order they are applied: the ones that mask a secret together with what
/// precedes it (a URL's user) before the token shapes that would keep the token's prefix.
pub(super) const RULES: &[Rule] = &[
    // Where tools print secrets.
    // A token as a URL's user, without a password (`https://TOKEN@github.com/o/r.git`): a user
    // of 20 or more token characters. `ssh://git@host` and `https://me@host` stay.
    rule(
        "url-user-token",
        r"(?i)\b([a-z][a-z0-9+.\-]*://)[A-Za-z0-9_\-]{20,}@",
        "${1}***@",
    ),
    // A Slack incoming webhook or workflow trigger: its path is its credential.
    rule(
        "slack-webhook",
        r"\b(hooks\.slack\.com/(?:services|workflows|triggers)/)[A-Za-z0-9_/+\-]{8,}",
        "${1}***",
    ),
    // A Discord webhook's token, after its numeric id.
    rule(
        "discord-webhook",
        r"\b(discord(?:app)?\.com/api/webhooks/[0-9]+/)[A-Za-z0-9_\-]{20,}",
        "${1}***",
    ),
    // An `.npmrc`'s credentials: `//registry/:_authToken=…`, `_auth=…`, `_password=…`.
    rule(
        "npmrc-auth",
        r#"(?m)((?:^|/:)_(?:authToken|auth|password)[ \t]*=[ \t]*)[^\s"']+"#,
        "${1}***",
    ),
    // A `.netrc` entry on one line: `machine HOST login USER password SECRET`.
    rule(
        "netrc-password",
        r"\b(login[ \t]+\S+[ \t]+password[ \t]+)\S+",
        "${1}***",
    ),
    // A `.netrc` entry over several lines: a line that is `password SECRET` alone.
    rule(
        "netrc-password-line",
        r"(?m)^([ \t]*password[ \t]+)\S+([ \t\r]*)$",
        "${1}***${2}",
    ),
    // The MySQL and MariaDB clients' password glued to `-p` (`mysql -u root -pSECRET`).
    rule(
        "mysql-password-flag",
        r"\b((?:mysql\w*|mariadb(?:-\w+)?)\b[^\n]*?[ \t]-p)\S+",
        "${1}***",
    ),
    // curl's `-u USER:PASSWORD` (or `--user`, quoted or not): the password.
    rule(
        "curl-user-password",
        r#"\b(curl\b[^\n]*?[ \t](?:-u[ \t]*|--user[ \t=][ \t]*)["']?[^\s:"']*:)[^\s"']+"#,
        "${1}***",
    ),
    // Token shapes.
    // GitHub: personal (`ghp_`), OAuth (`gho_`), user-to-server (`ghu_`), server-to-server
    // (`ghs_`) and refresh (`ghr_`) tokens, and fine-grained personal tokens.
    rule("github-token", r"\b(gh[pousr]_)[A-Za-z0-9]{30,}", "${1}***"),
    rule(
        "github-fine-grained-pat",
        r"\b(github_pat_)[A-Za-z0-9_]{20,}",
        "${1}***",
    ),
    // GitLab: personal, deploy, runner, pipeline trigger, CI job, feed, incoming mail, agent,
    // OAuth application and SCIM tokens, and runner registration tokens.
    rule(
        "gitlab-token",
        r"\b((?:glpat|gldt|glrt|glptt|glcbt|glft|glimt|glagent|gloas|glsoat)-)[A-Za-z0-9_.\-]{20,}",
        "${1}***",
    ),
    rule(
        "gitlab-runner-registration-token",
        r"\b(GR1348941)[A-Za-z0-9_\-]{20,}",
        "${1}***",
    ),
    // Slack: bot, user, app, refresh, configuration and legacy tokens.
    rule(
        "slack-token",
        r"\b(xox[abeoprs]-|xapp-)[A-Za-z0-9\-]{10,}",
        "${1}***",
    ),
    // Stripe secret and restricted keys (live, test or sandbox); publishable keys are public.
    rule(
        "stripe-secret-key",
        r"\b((?:sk|rk)_(?:live|test|prod)_)[A-Za-z0-9]{10,}",
        "${1}***",
    ),
    // Webhook signing secrets (Stripe, Standard Webhooks).
    rule(
        "webhook-signing-secret",
        r"\b(whsec_)[A-Za-z0-9+/=]{20,}",
        "${1}***",
    ),
    // Google: API keys and OAuth access tokens.
    rule("google-api-key", r"\b(AIza)[0-9A-Za-z_\-]{35}", "${1}***"),
    rule(
        "google-oauth-token",
        r"\b(ya29\.)[0-9A-Za-z_\-]{20,}",
        "${1}***",
    ),
    // SendGrid: `SG.` then an id and a secret, dot-separated.
    rule(
        "sendgrid-api-key",
        r"\b(SG\.)[A-Za-z0-9_\-]{16,32}\.[A-Za-z0-9_\-]{16,64}",
        "${1}***",
    ),
    // npm access tokens, PyPI upload tokens, RubyGems API keys.
    rule("npm-token", r"\b(npm_)[A-Za-z0-9]{36}\b", "${1}***"),
    rule(
        "pypi-token",
        r"\b(pypi-)AgEIcHlwaS5vcmc[A-Za-z0-9_\-]{50,}",
        "${1}***",
    ),
    rule(
        "rubygems-api-key",
        r"\b(rubygems_)[a-f0-9]{48}\b",
        "${1}***",
    ),
    // AWS access key ids (long-term, temporary and the others of the family).
    rule(
        "aws-access-key-id",
        r"\b(AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[0-9A-Z]{16}\b",
        "${1}***",
    ),
    // Anthropic and OpenAI API keys.
    rule(
        "anthropic-api-key",
        r"\b(sk-ant-)[A-Za-z0-9_\-]{20,}",
        "${1}***",
    ),
    rule(
        "openai-api-key",
        r"\b(sk-(?:proj|svcacct|admin)-)[A-Za-z0-9_\-]{20,}",
        "${1}***",
    ),
    rule(
        "openai-legacy-api-key",
        r"\b(sk-)[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}",
        "${1}***",
    ),
    // Hugging Face user and organization tokens.
    rule(
        "huggingface-token",
        r"\b(hf_|api_org_)[A-Za-z]{34}\b",
        "${1}***",
    ),
    // DigitalOcean personal, OAuth and refresh tokens.
    rule(
        "digitalocean-token",
        r"\b(do[por]_v1_)[a-f0-9]{64}",
        "${1}***",
    ),
    // Shopify access tokens and shared secrets.
    rule(
        "shopify-token",
        r"\b(shp(?:at|ca|pa|ss)_)[a-fA-F0-9]{32}",
        "${1}***",
    ),
    // HashiCorp Vault service, batch and recovery tokens.
    rule(
        "vault-token",
        r"\b(hv[sbr]\.)[A-Za-z0-9_\-]{24,}",
        "${1}***",
    ),
    // Docker Hub personal access tokens.
    rule(
        "docker-hub-pat",
        r"\b(dckr_pat_)[A-Za-z0-9_\-]{20,}",
        "${1}***",
    ),
    // Databricks, Linear, Postman, Pulumi, Doppler, PlanetScale, Sentry, New Relic tokens.
    rule("databricks-token", r"\b(dapi)[a-f0-9]{32}\b", "${1}***"),
    rule("linear-api-key", r"\b(lin_api_)[A-Za-z0-9]{40}", "${1}***"),
    rule(
        "postman-api-key",
        r"\b(PMAK-)[a-f0-9]{24}-[a-f0-9]{34}",
        "${1}***",
    ),
    rule("pulumi-token", r"\b(pul-)[a-f0-9]{40}", "${1}***"),
    rule(
        "doppler-token",
        r"\b(dp\.(?:pt|st|sa|ct|scim|audit)\.)[A-Za-z0-9]{40,}",
        "${1}***",
    ),
    rule(
        "planetscale-token",
        r"\b(pscale_(?:tkn|oauth|pw)_)[A-Za-z0-9_.=\-]{32,}",
        "${1}***",
    ),
    rule(
        "sentry-token",
        r"\b(sntry[us]_)[A-Za-z0-9_+/=]{32,}",
        "${1}***",
    ),
    rule(
        "newrelic-key",
        r"\b(NRAK-|NRII-|NRJS-)[A-Za-z0-9]{19,32}\b",
        "${1}***",
    ),
    // Twilio API key sids; Grafana cloud and service account tokens; age secret keys.
    rule("twilio-api-key", r"\b(SK)[0-9a-fA-F]{32}\b", "${1}***"),
    rule(
        "grafana-token",
        r"\b(glc_|glsa_)[A-Za-z0-9_+/=]{32,}",
        "${1}***",
    ),
    rule(
        "age-secret-key",
        r"\b(AGE-SECRET-KEY-1)[0-9A-Z]{58}\b",
        "${1}***",
    ),
    // JSON Web Tokens, whole: their header says nothing worth keeping.
    rule(
        "jwt",
        r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
        "***",
    ),
];

/// A rule's pattern with its word boundaries made ASCII ones.
fn ascii_boundaries(pattern: &str) -> String {
    pattern.replace(r"\b", r"(?-u:\b)")
}

/// The rules compiled: the set that says which match, and each rule's own pattern.
static COMPILED: LazyLock<(RegexSet, Vec<Regex>)> = LazyLock::new(|| {
    let patterns: Vec<String> = RULES.iter().map(|r| ascii_boundaries(r.pattern)).collect();
    let set = RegexSet::new(&patterns).expect("valid patterns");
    let each = RULES
        .iter()
        .zip(&patterns)
        .map(|(rule, pattern)| {
            Regex::new(pattern).unwrap_or_else(|e| panic!("the rule {}: {e}", rule.id))
        })
        .collect();
    (set, each)
});

/// `text` with every rule's matches masked, or `None` when no rule matches it.
pub(super) fn mask(text: &str) -> Option<String> {
    let (set, each) = &*COMPILED;
    let matched = set.matches(text);
    if !matched.matched_any() {
        return None;
    }
    let mut text = text.to_owned();
    for index in matched.iter() {
        text = each[index]
            .replace_all(&text, RULES[index].mask)
            .into_owned();
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An example of each rule's secret, in the context the rule needs, and the part of it that
    /// must not survive. The tokens are made up, of the right shape.
    fn examples() -> Vec<(&'static str, String, String)> {
        let hex = |n: usize| "0123456789abcdef".repeat(8)[..n].to_owned();
        let alnum = |n: usize| "aB3dE5fG7hJ9kL1mN2pQ4rS6tU8vW0xYz".repeat(8)[..n].to_owned();
        let upper = |n: usize| "QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L".repeat(4)[..n].to_owned();
        let e = |id, text: String, secret: String| (id, text, secret);
        vec![
            e(
                "url-user-token",
                format!("https://{}@git.example.com/r", alnum(40)),
                alnum(40),
            ),
            e(
                "slack-webhook",
                format!("https://hooks.slack.com/services/T0ABC/B0DEF/{}", alnum(24)),
                alnum(24),
            ),
            e(
                "discord-webhook",
                format!("https://discord.com/api/webhooks/123456/{}", alnum(40)),
                alnum(40),
            ),
            e(
                "npmrc-auth",
                format!("//npm.example.com/:_authToken={}", alnum(30)),
                alnum(30),
            ),
            e(
                "netrc-password",
                "machine h login u password Pa55-w0rd!".into(),
                "Pa55-w0rd!".into(),
            ),
            e(
                "netrc-password-line",
                "  login u\r\n  password Pa55-w0rd!\r\n".into(),
                "Pa55-w0rd!".into(),
            ),
            e(
                "mysql-password-flag",
                "mariadb-dump -u root -pPa55-w0rd! db".into(),
                "Pa55-w0rd!".into(),
            ),
            e(
                "curl-user-password",
                "curl -u 'u:Pa55-w0rd!' https://h".into(),
                "Pa55-w0rd!".into(),
            ),
            e("github-token", format!("gho_{}", alnum(36)), alnum(36)),
            e(
                "github-fine-grained-pat",
                format!("github_pat_{}", alnum(82)),
                alnum(82),
            ),
            e("gitlab-token", format!("glrt-{}", alnum(20)), alnum(20)),
            e(
                "gitlab-runner-registration-token",
                format!("GR1348941{}", alnum(20)),
                alnum(20),
            ),
            e("slack-token", format!("xapp-1-A0{}", alnum(20)), alnum(20)),
            e(
                "stripe-secret-key",
                format!("sk_test_{}", alnum(24)),
                alnum(24),
            ),
            e(
                "webhook-signing-secret",
                format!("whsec_{}", alnum(32)),
                alnum(32),
            ),
            e("google-api-key", format!("AIza{}", alnum(35)), alnum(35)),
            e(
                "google-oauth-token",
                format!("ya29.{}", alnum(60)),
                alnum(60),
            ),
            e(
                "sendgrid-api-key",
                format!("SG.{}.{}", alnum(22), alnum(43)),
                alnum(43),
            ),
            e("npm-token", format!("npm_{}", alnum(36)), alnum(36)),
            e(
                "pypi-token",
                format!("pypi-AgEIcHlwaS5vcmc{}", alnum(60)),
                alnum(60),
            ),
            e("rubygems-api-key", format!("rubygems_{}", hex(48)), hex(48)),
            e("aws-access-key-id", format!("ASIA{}", upper(16)), upper(16)),
            e(
                "anthropic-api-key",
                format!("sk-ant-api03-{}", alnum(80)),
                alnum(80),
            ),
            e(
                "openai-api-key",
                format!("sk-proj-{}", alnum(80)),
                alnum(80),
            ),
            e(
                "openai-legacy-api-key",
                format!("sk-{}T3BlbkFJ{}", alnum(20), alnum(20)),
                alnum(20),
            ),
            e(
                "huggingface-token",
                format!("hf_{}", "abcdefghijklmnopqrstuvwxyzABCDEFGH"),
                "abcdefghijklmnopqrstuvwxyzABCDEFGH".into(),
            ),
            e("digitalocean-token", format!("dop_v1_{}", hex(64)), hex(64)),
            e("shopify-token", format!("shpat_{}", hex(32)), hex(32)),
            e("vault-token", format!("hvs.{}", alnum(90)), alnum(90)),
            e(
                "docker-hub-pat",
                format!("dckr_pat_{}", alnum(27)),
                alnum(27),
            ),
            e("databricks-token", format!("dapi{}", hex(32)), hex(32)),
            e(
                "linear-api-key",
                format!("lin_api_{}", alnum(40)),
                alnum(40),
            ),
            e(
                "postman-api-key",
                format!("PMAK-{}-{}", hex(24), hex(34)),
                hex(34),
            ),
            e("pulumi-token", format!("pul-{}", hex(40)), hex(40)),
            e("doppler-token", format!("dp.pt.{}", alnum(43)), alnum(43)),
            e(
                "planetscale-token",
                format!("pscale_pw_{}", alnum(43)),
                alnum(43),
            ),
            e("sentry-token", format!("sntryu_{}", hex(64)), hex(64)),
            e("newrelic-key", format!("NRAK-{}", upper(27)), upper(27)),
            e("twilio-api-key", format!("SK{}", hex(32)), hex(32)),
            e(
                "grafana-token",
                format!("glsa_{}_{}", alnum(32), hex(8)),
                alnum(32),
            ),
            e(
                "age-secret-key",
                format!("AGE-SECRET-KEY-1{}", upper(58)),
                upper(58),
            ),
            e(
                "jwt",
                format!(
                    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIx{}.{}",
                    alnum(10),
                    alnum(43)
                ),
                alnum(43),
            ),
        ]
    }

    #[test]
    fn every_rule_masks_its_example() {
        let examples = examples();
        for rule in RULES {
            assert!(
                examples.iter().any(|(id, _, _)| *id == rule.id),
                "the rule {} has no example",
                rule.id
            );
        }
        for (id, example, secret) in &examples {
            let text = format!("before {example} after\n");
            let masked = mask(&text).unwrap_or_else(|| panic!("{id}: {text:?} was not masked"));
            assert!(!masked.contains(secret.as_str()), "{id}: {masked:?}");
            assert!(masked.contains("***"), "{id}: {masked:?}");
            assert!(
                masked.starts_with("before ") && masked.ends_with(" after\n"),
                "{id}: {masked:?}"
            );
            // Masking again changes nothing.
            assert_eq!(
                mask(&masked).unwrap_or_else(|| masked.clone()),
                masked,
                "{id}"
            );
        }
    }

    #[test]
    fn text_near_a_rule_that_holds_no_secret_is_kept() {
        for kept in [
            "ssh://git@github.com/o/r.git and https://me@example.com/x",
            "mysql -u root -p app (prompts) and mysql --port 3306 -P 3307",
            "curl -u deploy https://api.example.com (prompts); curl -fsS https://h:8080/x",
            "the password reset flow sent 3 mails; login as admin",
            "see https://api.slack.com/messaging/webhooks and hooks.slack.com/services/",
            "skip_test_data, sk_live_ alone, AIza too short, SG.short.x, npm_ci_cache",
            "SKU 4711 ordered; risk_live_feed; grafana glc_ prefix; ghp_ alone",
            "a.b.c eyJ short; dapi is a word; hvs.short",
            "ünïcödé ✓ 日本語 with no secret in it",
        ] {
            assert_eq!(mask(kept), None, "{kept}");
        }
    }
}
