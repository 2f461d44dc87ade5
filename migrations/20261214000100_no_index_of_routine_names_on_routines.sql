-- Every fire updates its routine's row, and the update is not HOT (the routine's next run is
-- indexed), so the row takes a new entry in every index of `routines` on every fire. One of
-- those was `routines_name_idx`, whose entries go where the name sorts: at a random place for
-- each routine of a claim, which otherwise writes its routines' entries in the order of their
-- ids. Its readers (a routine by name, a shell's completion of names) read `routine_names`,
-- which holds every routine's name as its key and is written only when a name is.
DROP INDEX cm.routines_name_idx;
