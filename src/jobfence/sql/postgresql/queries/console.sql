-- The operators' console (jobfence.ops.ui): what only the page asks.

-- name: console_done_per_minute
-- Jobs completed per minute over the last hour (one fence row per completed job).
SELECT floor(extract(epoch FROM (now() - processed_at)) / 60)::int AS ago, count(*) AS n
FROM core.processed_jobs
WHERE processed_at > now() - interval '60 minutes'
  AND expires_at > now() - interval '60 minutes'  -- expires_at > processed_at: older days pruned
GROUP BY 1

-- name: console_failed_per_minute
-- Jobs dead-lettered per minute over the last hour, within a partner scope.
SELECT floor(extract(epoch FROM (now() - failed_at)) / 60)::int AS ago, count(*) AS n
FROM core.dead_letters
WHERE failed_at > now() - interval '60 minutes'
  AND (%(partner)s::text IS NULL OR partner = %(partner)s)
GROUP BY 1

-- name: audit_search
-- The audit log filtered by actor, action (exact, or a prefix ending in '.') and time.
SELECT id, at, actor, via, action, partner, dead_letter_id, replay_id, reason, details,
       old_state, new_state
FROM core.audit_log
WHERE (%(partner)s::text IS NULL OR partner = %(partner)s)
  AND (%(dead_letter_id)s::bigint IS NULL OR dead_letter_id = %(dead_letter_id)s)
  AND (%(replay_id)s::bigint IS NULL OR replay_id = %(replay_id)s)
  AND (%(actor)s::text IS NULL OR actor = %(actor)s)
  AND (%(action)s::text IS NULL OR action = %(action)s OR action LIKE %(action_prefix)s ESCAPE '\')
  AND (%(since)s::timestamptz IS NULL OR at >= %(since)s)
  AND (%(until)s::timestamptz IS NULL OR at < %(until)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s
