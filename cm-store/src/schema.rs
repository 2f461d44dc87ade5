//! Where cm's objects live: one schema of their own (`cm` unless set), and every name cm sends
//! qualified with it.
//!
//! cm shares its users' databases: its tables, indexes, functions and its migrations table are in
//! one schema, nothing of cm's is in `public`, and sqlx's default migrations table
//! (`_sqlx_migrations`, which a sibling service's own `sqlx::migrate!` uses) is never read or
//! written. Every statement names cm's objects with their schema (`cm.routines`), so no
//! `search_path` a role or a URL sets changes what cm reads, writes or migrates.
//!
//! # Another schema
//!
//! The schema is the process's, set once at start with [`Schema::set`] (the binary's `--schema`
//! flag, `CM_SCHEMA`) before the first statement; unset, it is `cm`. The statements are written
//! naming `cm.`; for another schema each text is rewritten once, on its first use, and kept for
//! the life of the process. The [`crate::tx`] functions, which take the caller's connection, read
//! the same setting. A process serves one schema: two stores in one process on two schemas are
//! not supported.
//!
//! # Migrations
//!
//! [`migrator`] applies the embedded migrations (crate `cm-migrations`) into the schema, with the
//! search path of each migration's transaction pinned to `<schema>, pg_catalog, pg_temp`, and
//! records them in `<schema>.migrations`. For `cm` the texts are applied byte for byte, so their
//! checksums are those sqlx recorded before cm had a schema of its own (a `public` layout from
//! then is moved into `cm` first); for another schema the texts name that schema, and their
//! checksums are stable per schema.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use sqlx::SqlSafeStr as _;
use sqlx::migrate::{Migration, Migrator};

use crate::StoreError;

/// The schema cm's objects live in when none is set.
pub const DEFAULT_SCHEMA: &str = "cm";

/// The name of cm's migrations table inside its schema. Not sqlx's default `_sqlx_migrations`:
/// a sibling service whose search path lists cm's schema first must never find cm's table when
/// its own migrator asks for `_sqlx_migrations` unqualified.
pub const MIGRATIONS_TABLE: &str = "migrations";

/// The process's schema, set once.
static CURRENT: OnceLock<Schema> = OnceLock::new();

/// A schema name cm's objects live in: a lowercase SQL identifier (letters, digits and `_`, not
/// beginning with a digit or `pg_`, at most 63 bytes), so it is written unquoted everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schema(&'static str);

impl Schema {
    /// Checks `name` and makes it a schema name.
    pub fn parse(name: &str) -> Result<Schema, StoreError> {
        let valid = !name.is_empty()
            && name.len() <= 63
            && !name.starts_with("pg_")
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(StoreError::InvalidSchema(name.to_owned()));
        }
        if name == DEFAULT_SCHEMA {
            return Ok(Schema(DEFAULT_SCHEMA));
        }
        Ok(Schema(Box::leak(name.to_owned().into_boxed_str())))
    }

    /// Makes `name` the process's schema. Call it once at start, before any store statement;
    /// setting the schema already in use again is accepted, another one is refused
    /// ([`StoreError::SchemaAlreadySet`]).
    pub fn set(name: &str) -> Result<Schema, StoreError> {
        let wanted = Schema::parse(name)?;
        let current = *CURRENT.get_or_init(|| wanted);
        if current != wanted {
            return Err(StoreError::SchemaAlreadySet {
                current: current.0.to_owned(),
                wanted: wanted.0.to_owned(),
            });
        }
        Ok(current)
    }

    /// The process's schema: the one [`Schema::set`] set, else `cm` (fixed from then on).
    pub fn current() -> Schema {
        *CURRENT.get_or_init(|| Schema(DEFAULT_SCHEMA))
    }

    /// The schema's name.
    pub fn name(self) -> &'static str {
        self.0
    }

    /// Whether this is the default schema, `cm`, whose statements are sent as written.
    fn is_default(self) -> bool {
        self.0 == DEFAULT_SCHEMA
    }

    /// `<schema>.migrations`, cm's migrations table.
    pub fn migrations_table(self) -> String {
        format!("{}.{MIGRATIONS_TABLE}", self.0)
    }

    /// The search path every migration of this schema runs with: the schema, then the
    /// catalog, then (explicitly last, so no temporary object can stand in for one of cm's) the
    /// session's temporary schema.
    pub fn pinned_search_path(self) -> String {
        format!("{}, pg_catalog, pg_temp", self.0)
    }

    /// `text` (written for schema `cm`) naming this schema instead: each `cm.` that begins a
    /// qualified name becomes `<schema>.`. The setting `cm.group_count` is not a schema's name
    /// and stays.
    pub fn rewrite(self, text: &str) -> String {
        if self.is_default() {
            return text.to_owned();
        }
        let mut out = String::with_capacity(text.len() + 16);
        let mut rest = text;
        while let Some(at) = rest.find("cm.") {
            let before = rest[..at].chars().next_back();
            let starts_name =
                !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
            let setting = rest[at..].starts_with("cm.group_count");
            out.push_str(&rest[..at]);
            if starts_name && !setting {
                out.push_str(self.0);
                out.push('.');
            } else {
                out.push_str("cm.");
            }
            rest = &rest[at + 3..];
        }
        out.push_str(rest);
        // The migration that created the schema names it bare.
        out.replace(
            "CREATE SCHEMA IF NOT EXISTS cm;",
            &format!("CREATE SCHEMA IF NOT EXISTS {};", self.0),
        )
    }
}

impl std::fmt::Display for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

/// `text`, a statement written for schema `cm`, for the process's schema: itself for `cm`, else
/// its rewrite, made once per text and kept (leaked: one copy per statement for the life of the
/// process, which a process's fixed set of statements bounds).
pub(crate) fn sql(text: &'static str) -> &'static str {
    let schema = Schema::current();
    if schema.is_default() {
        return text;
    }
    static REWRITTEN: OnceLock<Mutex<HashMap<&'static str, &'static str>>> = OnceLock::new();
    let mut cache = REWRITTEN
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    cache
        .entry(text)
        .or_insert_with(|| Box::leak(schema.rewrite(text).into_boxed_str()))
}

/// The migrations of `schema`, applied into it: each migration's text (rewritten for a schema
/// other than `cm`) run after `SET LOCAL search_path` to [`Schema::pinned_search_path`], its
/// checksum that of the text alone, recorded in `<schema>.migrations`; the schema is created
/// first when missing.
pub fn migrator(schema: Schema) -> Migrator {
    let migrations = cm_migrations::EMBEDDED
        .iter()
        .map(|embedded| {
            let text = schema.rewrite(embedded.sql.as_str());
            let checksum: Cow<'static, [u8]> = if schema.is_default() {
                embedded.checksum.clone()
            } else {
                Migration::new(
                    embedded.version,
                    embedded.description.clone(),
                    embedded.migration_type,
                    sqlx::AssertSqlSafe(text.clone()).into_sql_str(),
                    embedded.no_tx,
                )
                .checksum
            };
            // Outside a transaction (a migration marked `-- no-transaction`) the path is set
            // for the session and reset after it.
            let pinned = if embedded.no_tx {
                format!(
                    "SET search_path TO {};\n{text};\nRESET search_path;",
                    schema.pinned_search_path()
                )
            } else {
                format!(
                    "SET LOCAL search_path TO {};\n{text}",
                    schema.pinned_search_path()
                )
            };
            Migration {
                version: embedded.version,
                description: embedded.description.clone(),
                migration_type: embedded.migration_type,
                sql: sqlx::AssertSqlSafe(pinned).into_sql_str(),
                checksum,
                no_tx: embedded.no_tx,
            }
        })
        .collect();
    let mut migrator = Migrator::with_migrations(migrations);
    migrator.dangerous_set_table_name(schema.migrations_table());
    migrator.create_schema(schema.name());
    migrator
}

/// `sqlx::query` of a statement written for schema `cm`, sent for the process's schema (see
/// [`sql`]). Every statement of the store goes through one of these four.
pub(crate) fn query<'q>(
    text: &'static str,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql(text))
}

/// `sqlx::query_as` for the process's schema (see [`query`]).
pub(crate) fn query_as<'q, DB, O>(
    text: &'static str,
) -> sqlx::query::QueryAs<'q, DB, O, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    O: for<'r> sqlx::FromRow<'r, DB::Row>,
{
    sqlx::query_as(sql(text))
}

/// `sqlx::query_scalar` for the process's schema (see [`query`]).
pub(crate) fn query_scalar<'q, DB, O>(
    text: &'static str,
) -> sqlx::query::QueryScalar<'q, DB, O, <DB as sqlx::Database>::Arguments>
where
    DB: sqlx::Database,
    (O,): for<'r> sqlx::FromRow<'r, DB::Row>,
{
    sqlx::query_scalar(sql(text))
}

/// `sqlx::raw_sql` for the process's schema (see [`query`]).
pub(crate) fn raw_sql(text: &'static str) -> sqlx::RawSql {
    sqlx::raw_sql(sql(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_a_plain_lowercase_identifier() {
        for good in ["cm", "other", "cm_2", "_x"] {
            assert_eq!(Schema::parse(good).unwrap().name(), good);
        }
        for bad in [
            "",
            "Cm",
            "pg_cm",
            "1cm",
            "cm.x",
            "cm;drop",
            "a\"b",
            &"x".repeat(64),
        ] {
            assert!(Schema::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn a_rewrite_names_the_schema_and_leaves_the_setting() {
        let other = Schema::parse("other").unwrap();
        let check = |text: &str, expected: &str| assert_eq!(other.rewrite(text), expected);
        check(
            "SELECT 1 FROM cm.routines r",
            "SELECT 1 FROM other.routines r",
        );
        check("cm.checked_name(cm.x)", "other.checked_name(other.x)");
        check(
            "nextval('cm.outbox_messages_seq_seq')",
            "nextval('other.outbox_messages_seq_seq')",
        );
        check(
            "current_setting('cm.group_count', true)",
            "current_setting('cm.group_count', true)",
        );
        check("SELECT mcm.x, r.cm.y", "SELECT mcm.x, r.cm.y");
        check(
            "CREATE SCHEMA IF NOT EXISTS cm;",
            "CREATE SCHEMA IF NOT EXISTS other;",
        );
        let cm = Schema::parse("cm").unwrap();
        assert_eq!(cm.rewrite("FROM cm.routines"), "FROM cm.routines");
    }

    #[test]
    fn the_default_schema_keeps_every_checksum() {
        let migrator = migrator(Schema::parse(DEFAULT_SCHEMA).unwrap());
        assert_eq!(migrator.table_name, "cm.migrations");
        for (pinned, embedded) in migrator.iter().zip(cm_migrations::EMBEDDED.iter()) {
            assert_eq!(pinned.version, embedded.version);
            assert_eq!(pinned.checksum, embedded.checksum);
            assert!(
                pinned
                    .sql
                    .as_str()
                    .starts_with("SET LOCAL search_path TO cm, pg_catalog, pg_temp;\n")
            );
            assert!(pinned.sql.as_str().ends_with(embedded.sql.as_str()));
        }
        let other = migrator_for("other");
        assert_eq!(other.table_name, "other.migrations");
        let differs = other
            .iter()
            .zip(cm_migrations::EMBEDDED.iter())
            .any(|(o, e)| o.checksum != e.checksum);
        assert!(differs, "no migration names the schema");
    }

    /// cm's tables, as its statements must never name them: bare.
    const TABLES: [&str; 8] = crate::relocate::TABLES;

    /// The words after which a table's name is a table (not a column or a variable).
    const KEYWORDS: [&str; 9] = [
        "FROM", "JOIN", "INTO", "UPDATE", "TABLE", "USING", "ON", "TRUNCATE", "ANALYZE",
    ];

    /// Where `text` (Rust source) names one of cm's tables or functions without a schema in
    /// SQL: a keyword above followed by a bare table name (across spaces, line breaks and a
    /// string's `\` continuations), a table's name quoted (`'routines'::regclass`), or
    /// `cm_group_of(` bare. Lines that are comments are skipped. Each finding is
    /// `line: text`.
    fn unqualified(text: &str) -> Vec<String> {
        let code: String = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    ""
                } else {
                    l
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let is_word = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
        // Every word with where it starts and ends.
        let mut words: Vec<(usize, &str)> = Vec::new();
        let mut start = None;
        for (i, c) in code
            .char_indices()
            .chain(std::iter::once((code.len(), ' ')))
        {
            match (start, is_word(c)) {
                (None, true) => start = Some(i),
                (Some(s), false) => {
                    words.push((s, &code[s..i]));
                    start = None;
                }
                _ => {}
            }
        }
        let line_of = |at: usize| code[..at].matches('\n').count() + 1;
        let mut found = Vec::new();
        for pair in words.windows(2) {
            let ((k_at, keyword), (t_at, table)) = (pair[0], pair[1]);
            let between = &code[k_at + keyword.len()..t_at];
            if KEYWORDS.contains(&keyword)
                && TABLES.contains(&table)
                && between.chars().all(|c| c.is_whitespace() || c == '\\')
            {
                found.push(format!("{}: {keyword} {table}", line_of(t_at)));
            }
        }
        for &(at, word) in &words {
            let before = code[..at].chars().next_back();
            if TABLES.contains(&word) && before == Some('\'') {
                found.push(format!("{}: '{word}'", line_of(at)));
            }
            if word == "cm_group_of" && code[at + word.len()..].starts_with('(') {
                found.push(format!("{}: {word}(", line_of(at)));
            }
        }
        found
    }

    #[test]
    fn the_check_finds_a_bare_name() {
        // Written with `{}` so this file's own text holds no bare name.
        let bare = |sql: &str| unqualified(&sql.replace("{}", "routines"));
        assert_eq!(bare("\"SELECT 1 FROM {} r\""), ["1: FROM routines"]);
        assert_eq!(
            bare("\"UPDATE \\\n   {} SET x = 1\""),
            ["2: UPDATE routines"]
        );
        assert_eq!(bare("nextval('{}')"), ["1: 'routines'"]);
        assert_eq!(bare("\"SELECT cm_group_of(id, 4)\""), ["1: cm_group_of("]);
        assert!(bare("\"SELECT 1 FROM cm.{} r JOIN cm.{}\"").is_empty());
        assert!(bare("// rows FROM {} are read").is_empty());
        assert!(bare("let {} = store.{}(); ON {}.id").is_empty());
        assert!(bare("\"SELECT cm.cm_group_of(id, 4)\"").is_empty());
    }

    #[test]
    fn every_statement_names_cm_s_objects_with_the_schema() {
        // A statement naming a table bare reads whatever the session's search path finds first
        // (a sibling's `routines`, or nothing): every name cm sends carries `cm.`. This file is
        // left out: it holds the check's own words, and no statement.
        fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    rust_files(&path, out);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    out.push(path);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        assert!(files.len() > 20, "found only {} files", files.len());
        let mut found = Vec::new();
        for file in files.iter().filter(|f| !f.ends_with("schema.rs")) {
            let text = std::fs::read_to_string(file).unwrap();
            for at in unqualified(&text) {
                found.push(format!(
                    "{}:{at}",
                    file.strip_prefix(&src).unwrap().display()
                ));
            }
        }
        assert!(found.is_empty(), "names without `cm.`: {found:#?}");
    }

    fn migrator_for(name: &str) -> Migrator {
        migrator(Schema::parse(name).unwrap())
    }
}
