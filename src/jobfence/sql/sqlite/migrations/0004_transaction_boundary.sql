-- 0004: jobfence owns the transaction it lends a handler (SPEC H5).
--
-- Nothing to change on SQLite: the guard is each connection's authorizer, which refuses
-- BEGIN, COMMIT, END and ROLLBACK (and releasing jobfence's savepoints) while a handler holds
-- the transaction (jobfence/db/sqlite.py). The version is kept so that both dialects number
-- their migrations alike.
SELECT 1;
