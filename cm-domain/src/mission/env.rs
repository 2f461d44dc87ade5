//! The routine's own environment variables (`env`), and the floor of names no routine may set.
//!
//! A name is `[A-Z_][A-Z0-9_]*`, never `CM_*` (cm sets those) and never one [`DENIED_ENV`]
//! lists: the variables loaders, shells, interpreters, build tools and clients read to change what
//! runs or where it connects. The operator's `env_allow` ([`super::MissionPolicy`]) narrows what
//! is left; it never opens the floor.

use super::glob::glob_matches;
use super::{MissionError, refuse};

/// The most variables in `env`.
pub const MAX_ENV_VARS: usize = 64;
/// The most characters of one variable's name.
pub const MAX_ENV_NAME_CHARS: usize = 128;
/// The most bytes of one variable's value.
pub const MAX_ENV_VALUE_BYTES: usize = 8 * 1024;

/// The prefix of the environment variables cm itself gives every mission.
pub const RESERVED_ENV_PREFIX: &str = "CM_";

/// The variables a mission's `env` may never set, whatever the operator allows (the floor no
/// `env_allow` opens): each is read by a loader, a shell, an interpreter, a build tool, a package
/// manager or a common client (git, ssh, curl, docker, kubectl, a cloud SDK) to change what runs,
/// what code is loaded, what is trusted or where it connects. `*` stands for any run of
/// characters. A routine stored before a name was listed is refused when it comes due (settled
/// `failed`), never launched.
pub const DENIED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "SHELL",
    "IFS",
    "ENV",
    "BASH_ENV",
    "BASH_FUNC_*",
    "SHELLOPTS",
    "PS4",
    "LD_*",
    "GCONV_PATH",
    "GIT_*",
    "SSH_*",
    "*_PROXY",
    "NODE_OPTIONS",
    "NODE_PATH",
    "PYTHON*",
    "PERL5*",
    "PERLLIB",
    "RUBYOPT",
    "RUBYLIB",
    "JAVA_TOOL_OPTIONS",
    "_JAVA_OPTIONS",
    "JDK_JAVA_OPTIONS",
    "DOCKER_*",
    "KUBECONFIG",
    "TMPDIR",
    // The C library and the resolver: tunables, locale and message files, host aliases.
    "GLIBC_TUNABLES",
    "LOCPATH",
    "NLSPATH",
    "HOSTALIASES",
    "LOCALDOMAIN",
    "RES_OPTIONS",
    // Shells' start-up files and hooks, and the programs tools start for a page or an edit.
    "ZDOTDIR",
    "PROMPT_COMMAND",
    "XDG_*",
    "PAGER",
    "MANPAGER",
    "LESSOPEN",
    "LESSCLOSE",
    "EDITOR",
    "VISUAL",
    // Interpreters and build tools that load or run what a variable names.
    "LUA_INIT*",
    "LUA_PATH*",
    "LUA_CPATH*",
    "RUSTC*",
    "RUSTDOC*",
    "RUSTFLAGS",
    "RUSTUP_*",
    "CARGO_*",
    "GO*",
    "*_OPTS",
    "CLASSPATH",
    "JAVA_HOME",
    "MAVEN_*",
    "GRADLE_*",
    "CC",
    "CXX",
    "CFLAGS",
    "CXXFLAGS",
    "CPPFLAGS",
    "LDFLAGS",
    "MAKEFLAGS",
    "PHPRC",
    "PHP_INI_*",
    "CORECLR_*",
    "DOTNET_*",
    // Package managers' indexes and registries: where code is installed from.
    "PIP_*",
    "UV_*",
    "NPM_CONFIG_*",
    "YARN_*",
    "BUNDLE_*",
    "GEM_*",
    "COMPOSER_*",
    // What TLS trusts.
    "SSL_*",
    "CURL_*",
    "REQUESTS_CA_BUNDLE",
    "OPENSSL_*",
    "NODE_EXTRA_CA_CERTS",
    "NODE_TLS_*",
    // Cloud SDKs' endpoints, configuration and credentials.
    "AWS_*",
    "AZURE_*",
    "CLOUDSDK_*",
];

/// The entry of [`DENIED_ENV`] that `name` matches, if any.
///
/// ```
/// assert_eq!(cm_domain::mission::denied_env("HTTPS_PROXY"), Some("*_PROXY"));
/// assert_eq!(cm_domain::mission::denied_env("REPORT_FORMAT"), None);
/// ```
pub fn denied_env(name: &str) -> Option<&'static str> {
    DENIED_ENV
        .iter()
        .copied()
        .find(|pattern| glob_matches(pattern, name))
}

pub(super) fn check_env(name: &str, value: &str) -> Result<(), MissionError> {
    let field = format!("env.{name}");
    let mut chars = name.chars();
    let well_formed = chars
        .next()
        .is_some_and(|c| c.is_ascii_uppercase() || c == '_')
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if !well_formed || name.len() > MAX_ENV_NAME_CHARS {
        return Err(refuse(
            field,
            format!("names must match [A-Z_][A-Z0-9_]* (at most {MAX_ENV_NAME_CHARS} characters)"),
        ));
    }
    if name.starts_with(RESERVED_ENV_PREFIX) {
        return Err(refuse(
            field,
            "CM_* variables are set by cm itself and cannot be overridden",
        ));
    }
    if let Some(pattern) = denied_env(name) {
        return Err(refuse(
            field,
            format!(
                "{pattern} changes how a mission runs or where it connects, so a routine cannot \
                 set it (see the mission env rules)"
            ),
        ));
    }
    if value.len() > MAX_ENV_VALUE_BYTES {
        return Err(refuse(
            field,
            format!("is longer than {MAX_ENV_VALUE_BYTES} bytes"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mission::Mission;
    use crate::mission::testing::{accepted, mission, refused};

    #[test]
    fn environments() {
        accepted(&mission(r#""env": {"A": "1", "_B_2": "x", "REPORT": ""}"#));
        accepted(&mission(r#""env": null"#));
        for (env, field) in [
            (r#"{"CM_TASK": "x"}"#, "env.CM_TASK"),
            (r#"{"CM_": "x"}"#, "env.CM_"),
            (r#"{"lower": "x"}"#, "env.lower"),
            (r#"{"1A": "x"}"#, "env.1A"),
            (r#"{"A-B": "x"}"#, "env.A-B"),
            (r#"{"": "x"}"#, "env."),
            (r#"{"A": 1}"#, "env.A"),
            (r#"{"A": "a\u0000b"}"#, "env.A"),
            (r#"["A"]"#, "env"),
            (r#""A=1""#, "env"),
        ] {
            refused(&mission(&format!(r#""env": {env}"#)), field);
        }
        let long_value = "v".repeat(MAX_ENV_VALUE_BYTES + 1);
        refused(
            &mission(&format!(r#""env": {{"A": "{long_value}"}}"#)),
            "env.A",
        );
        let long_name = "A".repeat(MAX_ENV_NAME_CHARS + 1);
        refused(
            &mission(&format!(r#""env": {{"{long_name}": "x"}}"#)),
            &format!("env.{long_name}"),
        );
        let many: Vec<String> = (0..=MAX_ENV_VARS)
            .map(|i| format!(r#""V{i}": "x""#))
            .collect();
        refused(
            &mission(&format!(r#""env": {{{}}}"#, many.join(","))),
            "env",
        );
    }

    /// A name each entry of the deny list covers: `*` replaced by `X`.
    fn example_of(pattern: &str) -> String {
        pattern.replace('*', "X")
    }

    #[test]
    fn every_denied_environment_name_is_refused() {
        for pattern in DENIED_ENV {
            for name in [example_of(pattern), pattern.replace('*', "")] {
                // `*_PROXY` with nothing for the star is `_PROXY`, still a well-formed name.
                refused(
                    &mission(&format!(r#""env": {{"{name}": "x"}}"#)),
                    &format!("env.{name}"),
                );
            }
        }
        // The names the review used to steer a runner, each refused for its own entry.
        for (name, entry) in [
            ("BASH_ENV", "BASH_ENV"),
            ("PATH", "PATH"),
            ("GIT_SSH_COMMAND", "GIT_*"),
            ("GIT_CONFIG_COUNT", "GIT_*"),
            ("GIT_CONFIG_KEY_0", "GIT_*"),
            ("LD_PRELOAD", "LD_*"),
            ("LD_LIBRARY_PATH", "LD_*"),
            ("HTTPS_PROXY", "*_PROXY"),
            ("ALL_PROXY", "*_PROXY"),
            ("NO_PROXY", "*_PROXY"),
            ("PYTHONPATH", "PYTHON*"),
            ("PYTHONSTARTUP", "PYTHON*"),
            ("PERL5OPT", "PERL5*"),
            ("SSH_AUTH_SOCK", "SSH_*"),
            ("DOCKER_HOST", "DOCKER_*"),
            // The second review's, each created before the floor named it.
            ("LUA_INIT", "LUA_INIT*"),
            ("LUA_INIT_5_4", "LUA_INIT*"),
            ("ZDOTDIR", "ZDOTDIR"),
            ("RUSTC_WRAPPER", "RUSTC*"),
            ("CARGO_BUILD_RUSTC_WRAPPER", "CARGO_*"),
            ("GOFLAGS", "GO*"),
            ("GOPROXY", "GO*"),
            ("PIP_INDEX_URL", "PIP_*"),
            ("NPM_CONFIG_REGISTRY", "NPM_CONFIG_*"),
            ("AWS_ENDPOINT_URL", "AWS_*"),
            ("SSL_CERT_FILE", "SSL_*"),
            ("CURL_CA_BUNDLE", "CURL_*"),
            ("NODE_EXTRA_CA_CERTS", "NODE_EXTRA_CA_CERTS"),
            ("LESSOPEN", "LESSOPEN"),
            ("GLIBC_TUNABLES", "GLIBC_TUNABLES"),
            ("XDG_CONFIG_HOME", "XDG_*"),
            ("JAVA_OPTS", "*_OPTS"),
            ("MAVEN_OPTS", "*_OPTS"),
            ("CLASSPATH", "CLASSPATH"),
            ("OPENSSL_CONF", "OPENSSL_*"),
            ("GRADLE_USER_HOME", "GRADLE_*"),
        ] {
            assert_eq!(denied_env(name), Some(entry), "{name}");
            let err =
                Mission::from_json(&mission(&format!(r#""env": {{"{name}": "x"}}"#))).unwrap_err();
            assert!(err.to_string().contains(entry), "{err}");
        }
        // Names that only resemble an entry are the routine's to set.
        for name in [
            "PATHS",
            "MY_PATH",
            "HOMEPAGE",
            "ENVIRONMENT",
            "REPORT_FORMAT",
            "LANG",
            "PROXY",
            "GIT",
            "NODE_ENV",
            "XLD_X",
        ] {
            assert_eq!(denied_env(name), None, "{name}");
            accepted(&mission(&format!(r#""env": {{"{name}": "x"}}"#)));
        }
    }
}
