-- A sibling service's own migration, run by its own `sqlx::migrate!` into `public`: a table
-- named like one of cm's, of another shape.
CREATE TABLE routines (id BIGINT PRIMARY KEY, title TEXT NOT NULL);
INSERT INTO routines VALUES (1, 'the sibling''s own');
