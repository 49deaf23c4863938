-- The database's clock and row counts (dialect helpers).

-- name: now
SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') AS now

-- name: db_now
SELECT now() AS now
