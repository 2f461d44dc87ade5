//! cm's migrations, the `.sql` files beside this crate's manifest, embedded at build time.
//!
//! The texts are the schema's history: each is applied once, in version order, and its checksum
//! is recorded, so a text must never change once released. They name cm's objects without a
//! schema (`CREATE TABLE routines`), except the SQL functions (`cm.create_routine`), and are
//! applied by `cm-store` with the search path pinned to cm's schema; `cm-store` also substitutes
//! the schema's name when it is not `cm`. Nothing here runs them: see `cm_store::PgStore::migrate`.

/// Every migration, in version order, as sqlx's `migrate!` embeds them from this directory
/// (`src/..`: the macro refuses a path without a parent) (version, description,
/// text and checksum). Run through `cm-store`, which pins where they apply; running this
/// migrator directly would apply them wherever the connection's `search_path` points.
pub static EMBEDDED: sqlx::migrate::Migrator = sqlx::migrate!("src/..");
