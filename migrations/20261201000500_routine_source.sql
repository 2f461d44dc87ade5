-- Where a routine came from: the file `routine import --sync` keeps it in step with (by
-- default the file's name). A sync creates, updates and deletes only the routines of its
-- source. NULL for a routine made by hand or imported without --sync.
ALTER TABLE routines ADD COLUMN source text;

CREATE INDEX routines_source_idx ON routines (source) WHERE source IS NOT NULL;
