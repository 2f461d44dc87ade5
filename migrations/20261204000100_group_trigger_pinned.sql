-- cm's objects live in a schema of their own, applied with the search path pinned to it. The
-- trigger function that fills in a hand-written row's group names `cm_settings` and
-- `cm_group_of` unqualified, so it keeps the path it is created under (the schema, then the
-- catalog, then pg_temp), not the path of whoever inserts the row.
-- Written as a constant, not `FROM CURRENT`, which Citus refuses for a distributed function.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION cm_fill_group_id() SET search_path TO %s',
                   current_setting('search_path'));
END
$$;
