-- Named leases of background duties (jobfence.core.leases).

-- name: lease_acquire
INSERT INTO core.leases AS l (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, now() + make_interval(secs => %(ttl)s))
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    acquired_at = CASE WHEN l.holder = excluded.holder THEN l.acquired_at ELSE now() END,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < now()
RETURNING holder

-- name: lease_renew
UPDATE core.leases SET expires_at = now() + make_interval(secs => %(ttl)s)
WHERE name = %(name)s AND holder = %(holder)s
RETURNING holder

-- name: lease_holder
SELECT holder, expires_at FROM core.leases WHERE name = %(name)s

-- name: lease_release
DELETE FROM core.leases WHERE name = %(name)s AND holder = %(holder)s
