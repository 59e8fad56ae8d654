-- Queue websub_subscriptions.due on sqlite: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_websub_subscriptions_due_free (rows never leased, in the queue's order) and ix_websub_subscriptions_due_leased (expired leases, oldest first); the update by pk_websub_subscriptions
UPDATE websub_subscriptions SET attempts=(websub_subscriptions.attempts + 1), locked_until=?, claimed_by=?, claim_token=? WHERE websub_subscriptions.id IN (SELECT anon_1.id
FROM (SELECT websub_subscriptions.id AS id
FROM websub_subscriptions
WHERE websub_subscriptions.due_at IS NOT NULL AND websub_subscriptions.locked_until IS NOT NULL AND websub_subscriptions.locked_until <= ? AND websub_subscriptions.due_at <= ? ORDER BY websub_subscriptions.locked_until
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id
FROM (SELECT websub_subscriptions.id AS id
FROM websub_subscriptions
WHERE websub_subscriptions.due_at IS NOT NULL AND websub_subscriptions.locked_until IS NULL AND websub_subscriptions.due_at <= ? ORDER BY websub_subscriptions.due_at ASC, websub_subscriptions.id ASC
 LIMIT ? OFFSET ?) AS anon_2
 LIMIT ? OFFSET ?) RETURNING id, source_id, hub, topic, callback_token, secret, previous_secret, previous_secret_until, secret_since, state, requested_at, verified_at, lease_until, pushes, last_push_at, missed, missed_at, last_error, due_at, attempts, locked_until, claimed_by, claim_token;

-- complete (sets state, requested_at, due_at, last_error)
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET state=?, requested_at=?, last_error=?, due_at=?, locked_until=?, claimed_by=?, claim_token=? WHERE websub_subscriptions.id IN (__[POSTCOMPILE_ids]) AND websub_subscriptions.claim_token = ? AND websub_subscriptions.claimed_by = ? RETURNING id;

-- extend
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET locked_until=? WHERE websub_subscriptions.id IN (__[POSTCOMPILE_ids]) AND websub_subscriptions.claim_token = ? AND websub_subscriptions.claimed_by = ? AND websub_subscriptions.locked_until > ? RETURNING id;
