-- Queue source_alerts.due on sqlite: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_source_alerts_due_free (rows never leased, in the queue's order) and ix_source_alerts_due_leased (expired leases, oldest first); the update by pk_source_alerts
UPDATE source_alerts SET attempts=(source_alerts.attempts + 1), locked_until=?, claimed_by=?, claim_token=? WHERE source_alerts.id IN (SELECT anon_1.id
FROM (SELECT source_alerts.id AS id
FROM source_alerts
WHERE source_alerts.status IN ('pending', 'failed') AND source_alerts.locked_until IS NOT NULL AND source_alerts.locked_until <= ? AND source_alerts.next_attempt_at <= ? ORDER BY source_alerts.locked_until
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id
FROM (SELECT source_alerts.id AS id
FROM source_alerts
WHERE source_alerts.status IN ('pending', 'failed') AND source_alerts.locked_until IS NULL AND source_alerts.next_attempt_at <= ? ORDER BY source_alerts.next_attempt_at ASC, source_alerts.id ASC
 LIMIT ? OFFSET ?) AS anon_2
 LIMIT ? OFFSET ?) RETURNING id, source_id, user_id, event, reason, detail, created_at, status, attempts, next_attempt_at, last_error, sent_at, locked_until, claimed_by, claim_token;

-- complete (sets status, sent_at, last_error)
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET status=?, last_error=?, sent_at=?, locked_until=?, claimed_by=?, claim_token=? WHERE source_alerts.id IN (__[POSTCOMPILE_ids]) AND source_alerts.claim_token = ? AND source_alerts.claimed_by = ? RETURNING id;

-- extend
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET locked_until=? WHERE source_alerts.id IN (__[POSTCOMPILE_ids]) AND source_alerts.claim_token = ? AND source_alerts.claimed_by = ? AND source_alerts.locked_until > ? RETURNING id;
