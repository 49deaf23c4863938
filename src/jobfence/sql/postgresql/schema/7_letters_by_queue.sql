-- Declared schema for listing a queue's dead letters (issue 16 §3):
-- migrations/0009_dead_letters_by_queue.sql produces exactly this. A queue's first page,
-- newest first, is an index range read whatever the queue's share of the letters.
CREATE INDEX dead_letters_queue_id_idx ON core.dead_letters (queue, id);
