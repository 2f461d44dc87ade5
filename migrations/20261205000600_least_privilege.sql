-- Least privilege: a role `cm_writer` that may only call cm's functions.
--
-- An application's role granted `cm_writer` (`GRANT cm_writer TO app;`) creates, updates,
-- pauses, resumes, triggers, reads back and deletes routines through the functions of schema
-- `cm`, and cannot write cm's tables (it holds no privilege on them at all): every check the
-- functions make at insert holds for everything it writes.
--
-- For that every function of schema `cm` is SECURITY DEFINER: it runs as its owner, the role
-- that ran `cm-scheduler migrate` (so that role should own cm's schema and be no superuser;
-- deploy/postgres/roles.sql makes one). A SECURITY DEFINER function must not look anything up
-- on a path its caller controls: its path is pinned to the one the migrations run under,
-- `cm, pg_catalog, pg_temp`. `pg_temp` is named, and last: a path that does not name it has
-- PostgreSQL search the caller's temporary schema *first*, where a caller's temporary table
-- `routine_names` or `cm_settings` would stand in for cm's. `"$user"` is not on it: in a
-- SECURITY DEFINER function it is the owner's name.
--
-- EXECUTE on cm's functions is revoked from PUBLIC, now and for the functions later migrations
-- create; `cm_writer` gets USAGE on schema `cm` and EXECUTE on the write and read functions,
-- nothing else. The helpers (`cm.insert_unplanned`, `cm.checked_*`, …) stay the owner's, so no
-- caller writes a routine past the checks of the function that calls them.
--
-- Roles are the cluster's, shared by every database: the role is created only if missing, and
-- two migrations creating it at once (two databases migrated together) both succeed. A
-- migrating role without CREATEROLE works when an administrator made `cm_writer` first.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'cm_writer') THEN
        BEGIN
            CREATE ROLE cm_writer NOLOGIN;
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            -- Another migration created it between the check and the create.
            NULL;
        END;
    END IF;
END
$$;

-- The schema is the one these migrations run in (the first on their pinned path), so the same
-- text serves `cm` and a schema set with `--schema`. The path is written as a constant, not
-- `FROM CURRENT`, which Citus refuses for a distributed function.
DO $$
DECLARE
    s TEXT := current_schema();
    path TEXT := current_setting('search_path');
    f REGPROCEDURE;
BEGIN
    IF path !~ 'pg_temp' THEN
        path := format('%I, pg_catalog, pg_temp', s);
    END IF;
    FOR f IN SELECT p.oid FROM pg_proc p WHERE p.pronamespace = s::regnamespace LOOP
        EXECUTE format('ALTER FUNCTION %s SECURITY DEFINER SET search_path TO %s', f, path);
    END LOOP;
    EXECUTE format('REVOKE ALL ON ALL FUNCTIONS IN SCHEMA %I FROM PUBLIC', s);
    EXECUTE format('ALTER DEFAULT PRIVILEGES IN SCHEMA %I REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC', s);
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO cm_writer', s);
END
$$;
GRANT EXECUTE ON FUNCTION
    cm.create_routine(TEXT, TEXT, TEXT, TEXT, TEXT, BOOLEAN, INT),
    cm.create_mission_routine(TEXT, TEXT, TEXT, JSONB, TEXT, TEXT, BOOLEAN, INT),
    cm.update_routine(UUID, TEXT, TEXT, TEXT, TEXT, JSONB, TEXT, TEXT, INT, BOOLEAN),
    cm.set_routine_paused(UUID, BOOLEAN),
    cm.trigger_routine(UUID),
    cm.delete_routine(UUID),
    cm.get_routine(UUID)
TO cm_writer;
