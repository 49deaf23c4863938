-- The database's clock and row counts (dialect helpers).

-- name: now
SELECT {NOW_ISO} AS now

-- name: db_now
SELECT {NOW} AS now

-- name: changes
SELECT changes() AS changed
