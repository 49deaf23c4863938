-- The append-only audit log (jobfence.review.deadletters.record).

-- name: audit_insert
INSERT INTO core.audit_log (actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
VALUES (%(actor)s, %(via)s, %(action)s, %(partner)s, %(dead_letter_id)s, %(replay_id)s,
        %(reason)s, %(details)s::jsonb, %(old_state)s, %(new_state)s)
RETURNING id

-- name: audit_letters
-- One row per letter, after the statement that decided them: new_state is the state each
-- letter is in now (read in the same transaction), old_state the one it was decided from.
INSERT INTO core.audit_log (actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
SELECT %(actor)s, %(via)s, %(action)s, d.partner, d.id, %(replay_id)s, %(reason)s,
       %(details)s::jsonb, %(old_state)s, d.status
FROM core.dead_letters AS d
WHERE d.id = ANY(%(ids)s)
ORDER BY d.id

-- name: audit_list
SELECT id, at, actor, via, action, partner, dead_letter_id, replay_id, reason, details,
       old_state, new_state
FROM core.audit_log
WHERE (%(partner)s::text IS NULL OR partner = %(partner)s)
  AND (%(dead_letter_id)s::bigint IS NULL OR dead_letter_id = %(dead_letter_id)s)
  AND (%(replay_id)s::bigint IS NULL OR replay_id = %(replay_id)s)
  AND (%(actor)s::text IS NULL OR actor = %(actor)s)
  AND (%(before)s::bigint IS NULL OR id < %(before)s)
ORDER BY id DESC
LIMIT %(limit)s
