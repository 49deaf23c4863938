-- 0010: a time window of dead letters (since/until on failed_at) read through an index
-- (issue 16 §3): without one, the first page walked the primary key from the newest letter
-- down to the window, reading every newer letter (one day 60 days back at 1 000 000 letters:
-- ~667 000 rows). dl_search_window takes the window's lowest and highest ids from this index
-- (an index-only scan of the window) and walks the primary key between them.
CREATE INDEX dead_letters_failed_id_idx ON core.dead_letters (failed_at, id);
