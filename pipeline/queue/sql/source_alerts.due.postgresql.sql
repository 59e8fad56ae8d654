-- Queue source_alerts.due on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_source_alerts_due_free (rows never leased, in the queue's order) and ix_source_alerts_due_leased (expired leases, oldest first); the update by pk_source_alerts
WITH expired AS MATERIALIZED
(SELECT source_alerts.id AS id
FROM source_alerts
WHERE source_alerts.status IN ('pending', 'failed') AND source_alerts.locked_until IS NOT NULL AND source_alerts.locked_until <= now() AND source_alerts.next_attempt_at <= now() ORDER BY source_alerts.locked_until
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
free AS MATERIALIZED
(SELECT source_alerts.id AS id
FROM source_alerts
WHERE source_alerts.status IN ('pending', 'failed') AND source_alerts.locked_until IS NULL AND source_alerts.next_attempt_at <= now() ORDER BY source_alerts.next_attempt_at ASC, source_alerts.id ASC
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
c AS MATERIALIZED
(SELECT expired.id AS id
FROM expired UNION ALL SELECT free.id AS id
FROM free
 LIMIT %(claim_limit)s::INTEGER)
 UPDATE source_alerts SET attempts=(source_alerts.attempts + 1), locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM c WHERE source_alerts.id = c.id RETURNING source_alerts.id, source_alerts.source_id, source_alerts.user_id, source_alerts.event, source_alerts.reason, source_alerts.detail, source_alerts.created_at, source_alerts.status, source_alerts.attempts, source_alerts.next_attempt_at, source_alerts.last_error, source_alerts.sent_at, source_alerts.locked_until, source_alerts.claimed_by, source_alerts.claim_token;

-- complete (sets status, sent_at, last_error)
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET status=%(set_status)s::VARCHAR, last_error=%(set_last_error)s::VARCHAR, sent_at=%(set_sent_at)s::TIMESTAMP WITH TIME ZONE, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE source_alerts.id = ANY (%(ids)s::BIGINT[]) AND source_alerts.claim_token = %(fence_token)s::VARCHAR AND source_alerts.claimed_by = %(fence_worker)s::VARCHAR RETURNING source_alerts.id;

-- complete_each (sets status, sent_at, last_error)
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET status=anon_1.status, last_error=anon_1.last_error, sent_at=anon_1.sent_at, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, status VARCHAR(8), sent_at TIMESTAMP WITH TIME ZONE, last_error TEXT) WHERE source_alerts.id = anon_1.id AND source_alerts.claim_token = anon_1.fence_token AND source_alerts.claimed_by = anon_1.fence_worker RETURNING source_alerts.id;

-- extend
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET locked_until=(now() + %(claim_lease)s) WHERE source_alerts.id = ANY (%(ids)s::BIGINT[]) AND source_alerts.claim_token = %(fence_token)s::VARCHAR AND source_alerts.claimed_by = %(fence_worker)s::VARCHAR AND source_alerts.locked_until > now() RETURNING source_alerts.id;
