-- Queue websub_subscriptions.due on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_websub_subscriptions_due_free (rows never leased, in the queue's order) and ix_websub_subscriptions_due_leased (expired leases, oldest first); the update by pk_websub_subscriptions
WITH expired AS MATERIALIZED
(SELECT websub_subscriptions.id AS id
FROM websub_subscriptions
WHERE websub_subscriptions.due_at IS NOT NULL AND websub_subscriptions.locked_until IS NOT NULL AND websub_subscriptions.locked_until <= now() AND websub_subscriptions.due_at <= now() ORDER BY websub_subscriptions.locked_until
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
free AS MATERIALIZED
(SELECT websub_subscriptions.id AS id
FROM websub_subscriptions
WHERE websub_subscriptions.due_at IS NOT NULL AND websub_subscriptions.locked_until IS NULL AND websub_subscriptions.due_at <= now() ORDER BY websub_subscriptions.due_at ASC, websub_subscriptions.id ASC
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
c AS MATERIALIZED
(SELECT expired.id AS id
FROM expired UNION ALL SELECT free.id AS id
FROM free
 LIMIT %(claim_limit)s::INTEGER)
 UPDATE websub_subscriptions SET attempts=(websub_subscriptions.attempts + 1), locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM c WHERE websub_subscriptions.id = c.id RETURNING websub_subscriptions.id, websub_subscriptions.source_id, websub_subscriptions.hub, websub_subscriptions.topic, websub_subscriptions.callback_token, websub_subscriptions.secret, websub_subscriptions.previous_secret, websub_subscriptions.previous_secret_until, websub_subscriptions.secret_since, websub_subscriptions.state, websub_subscriptions.requested_at, websub_subscriptions.verified_at, websub_subscriptions.lease_until, websub_subscriptions.pushes, websub_subscriptions.last_push_at, websub_subscriptions.missed, websub_subscriptions.missed_at, websub_subscriptions.last_error, websub_subscriptions.due_at, websub_subscriptions.attempts, websub_subscriptions.locked_until, websub_subscriptions.claimed_by, websub_subscriptions.claim_token;

-- complete (sets state, requested_at, due_at, last_error)
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET state=%(set_state)s::VARCHAR, requested_at=%(set_requested_at)s::TIMESTAMP WITH TIME ZONE, last_error=%(set_last_error)s::VARCHAR, due_at=%(set_due_at)s::TIMESTAMP WITH TIME ZONE, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE websub_subscriptions.id = ANY (%(ids)s::BIGINT[]) AND websub_subscriptions.claim_token = %(fence_token)s::VARCHAR AND websub_subscriptions.claimed_by = %(fence_worker)s::VARCHAR RETURNING websub_subscriptions.id;

-- complete_each (sets state, requested_at, due_at, last_error)
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET state=anon_1.state, requested_at=anon_1.requested_at, last_error=anon_1.last_error, due_at=anon_1.due_at, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, state VARCHAR(16), requested_at TIMESTAMP WITH TIME ZONE, due_at TIMESTAMP WITH TIME ZONE, last_error TEXT) WHERE websub_subscriptions.id = anon_1.id AND websub_subscriptions.claim_token = anon_1.fence_token AND websub_subscriptions.claimed_by = anon_1.fence_worker RETURNING websub_subscriptions.id;

-- extend
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET locked_until=(now() + %(claim_lease)s) WHERE websub_subscriptions.id = ANY (%(ids)s::BIGINT[]) AND websub_subscriptions.claim_token = %(fence_token)s::VARCHAR AND websub_subscriptions.claimed_by = %(fence_worker)s::VARCHAR AND websub_subscriptions.locked_until > now() RETURNING websub_subscriptions.id;
