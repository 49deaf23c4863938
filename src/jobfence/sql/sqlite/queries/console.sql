-- The operators' console (jobfence.ops.ui): what only the page asks.

-- name: console_done_per_minute
-- Jobs completed per minute over the last hour (one fence row per completed job).
SELECT CAST(({NOW} - processed_at) / 60 AS INTEGER) AS ago, count(*) AS n
FROM core_processed_jobs
WHERE processed_at > {NOW} - 3600
GROUP BY 1

-- name: console_failed_per_minute
-- Jobs dead-lettered per minute over the last hour, within a partner scope.
SELECT CAST(({NOW} - failed_at) / 60 AS INTEGER) AS ago, count(*) AS n
FROM core_dead_letters
WHERE failed_at > {NOW} - 3600
  AND (:partner IS NULL OR partner = :partner)
GROUP BY 1

-- name: audit_search
-- The audit log filtered by actor, action (exact, or a prefix ending in '.') and time.
SELECT id, at, actor, via, action, partner, dead_letter_id, replay_id, reason, details,
       old_state, new_state
FROM core_audit_log
WHERE (:partner IS NULL OR partner = :partner)
  AND (:dead_letter_id IS NULL OR dead_letter_id = :dead_letter_id)
  AND (:replay_id IS NULL OR replay_id = :replay_id)
  AND (:actor IS NULL OR actor = :actor)
  AND (:action IS NULL OR action = :action OR action LIKE :action_prefix ESCAPE '\')
  AND (:since IS NULL OR at >= :since)
  AND (:until IS NULL OR at < :until)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit
