-- Declared schema for a time window of dead letters (issue 16 §3):
-- migrations/0010_dead_letters_by_time.sql produces exactly this. The window's ids come from
-- an index-only scan of it (dl_search_window).
CREATE INDEX dead_letters_failed_id_idx ON core.dead_letters (failed_at, id);
