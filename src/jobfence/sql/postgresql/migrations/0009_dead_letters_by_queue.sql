-- 0009: the first page of a queue's dead letters (newest first, ORDER BY id DESC) read from an
-- index in that order (issue 16 §3): with only (queue, failed_at), a rare queue's page walked
-- the primary key over ~50 000 of 1 000 000 letters, or read and sorted all of the queue's.
CREATE INDEX dead_letters_queue_id_idx ON core.dead_letters (queue, id);
