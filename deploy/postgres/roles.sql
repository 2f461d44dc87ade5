-- cm's roles, made once by an administrator, connected to the database cm lives in:
--
--     psql "postgres://admin@db.example.com/app" -v ON_ERROR_STOP=1 -f deploy/postgres/roles.sql
--
-- Three roles, each with only what it needs:
--
-- - `cm_migrator` (LOGIN) owns cm's schema and everything the migrations create; it runs
--   `cm-scheduler migrate` (a Kubernetes Job, a deploy step) and nothing else. cm's SQL
--   functions are SECURITY DEFINER, so they run as this role: it is not a superuser.
-- - `cm_scheduler` (LOGIN) runs `cm-scheduler run --no-migrate`: it reads and writes cm's
--   tables and calls cm's functions, and can neither create nor drop anything.
-- - `cm_writer` (NOLOGIN) is granted to applications (`GRANT cm_writer TO app;`): it may call
--   cm's write and read functions and nothing else. `migrate` makes it too, when the migrating
--   role may create roles; made here, the migrator needs no CREATEROLE.
--
-- Give the login roles their passwords (`\password cm_scheduler`) or certificates apart from
-- this file. Roles are the cluster's; the grants below are this database's.

CREATE ROLE cm_migrator LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
CREATE ROLE cm_scheduler LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE;
DO $$
BEGIN
    CREATE ROLE cm_writer NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$;

-- The migrator owns schema `cm` (the functions, and the tables where they live there). While
-- the tables and the migrations table live in `public`, it creates them there. The migrations
-- say `CREATE SCHEMA IF NOT EXISTS cm`, which PostgreSQL refuses without CREATE on the
-- database even when the schema exists, so the migrator has that too.
CREATE SCHEMA IF NOT EXISTS cm AUTHORIZATION cm_migrator;

DO $$
BEGIN
    EXECUTE format('GRANT CREATE ON DATABASE %I TO cm_migrator', current_database());
END
$$;

-- The scheduler: the schemas, and every table, sequence and function the migrator creates
-- from now on (so later migrations need no new grants).
GRANT USAGE ON SCHEMA cm TO cm_scheduler;
ALTER DEFAULT PRIVILEGES FOR ROLE cm_migrator
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO cm_scheduler;
ALTER DEFAULT PRIVILEGES FOR ROLE cm_migrator
    GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO cm_scheduler;
ALTER DEFAULT PRIVILEGES FOR ROLE cm_migrator
    GRANT EXECUTE ON FUNCTIONS TO cm_scheduler;
