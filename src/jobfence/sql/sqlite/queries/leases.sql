-- Named leases of background duties (jobfence.core.leases).

-- name: lease_acquire
INSERT INTO core_leases (name, holder, acquired_at, expires_at)
VALUES (:name, :holder, {NOW}, {NOW} + :ttl)
ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    acquired_at = CASE WHEN core_leases.holder = excluded.holder
                       THEN core_leases.acquired_at ELSE excluded.acquired_at END,
    expires_at = excluded.expires_at
WHERE core_leases.holder = excluded.holder OR core_leases.expires_at < {NOW}
RETURNING holder

-- name: lease_renew
UPDATE core_leases SET expires_at = {NOW} + :ttl
WHERE name = :name AND holder = :holder
RETURNING holder

-- name: lease_holder
SELECT holder, expires_at FROM core_leases WHERE name = :name

-- name: lease_release
DELETE FROM core_leases WHERE name = :name AND holder = :holder
