-- The append-only audit log (jobfence.review.deadletters.record).

-- name: audit_insert
INSERT INTO core_audit_log (at, actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
VALUES ({NOW}, :actor, :via, :action, :partner, :dead_letter_id, :replay_id, :reason,
        json(:details), :old_state, :new_state)
RETURNING id

-- name: audit_letters
-- One row per letter, after the statement that decided them: new_state is the state each
-- letter is in now, old_state the one it was decided from.
INSERT INTO core_audit_log (at, actor, via, action, partner, dead_letter_id, replay_id, reason,
                            details, old_state, new_state)
SELECT {NOW}, :actor, :via, :action, d.partner, d.id, :replay_id, :reason, json(:details),
       :old_state, d.status
FROM core_dead_letters AS d
WHERE d.id IN (SELECT value FROM json_each(:ids))
ORDER BY d.id

-- name: audit_list
SELECT id, at, actor, via, action, partner, dead_letter_id, replay_id, reason, details,
       old_state, new_state
FROM core_audit_log
WHERE (:partner IS NULL OR partner = :partner)
  AND (:dead_letter_id IS NULL OR dead_letter_id = :dead_letter_id)
  AND (:replay_id IS NULL OR replay_id = :replay_id)
  AND (:actor IS NULL OR actor = :actor)
  AND (:before IS NULL OR id < :before)
ORDER BY id DESC
LIMIT :limit
