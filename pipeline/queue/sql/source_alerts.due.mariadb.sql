-- Queue source_alerts.due on mariadb: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim_expired
-- served by ix_source_alerts_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT source_alerts.id, source_alerts.source_id, source_alerts.user_id, source_alerts.event, source_alerts.reason, source_alerts.detail, source_alerts.created_at, source_alerts.status, source_alerts.attempts, source_alerts.next_attempt_at, source_alerts.last_error, source_alerts.sent_at, source_alerts.locked_until, source_alerts.claimed_by, source_alerts.claim_token, utc_timestamp(6) AS claim_clock
FROM source_alerts
WHERE source_alerts.status IN ('pending', 'failed') AND source_alerts.locked_until IS NOT NULL AND source_alerts.locked_until <= utc_timestamp(6) AND source_alerts.next_attempt_at <= utc_timestamp(6) ORDER BY source_alerts.locked_until
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim_free
-- served by ix_source_alerts_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT source_alerts.id, source_alerts.source_id, source_alerts.user_id, source_alerts.event, source_alerts.reason, source_alerts.detail, source_alerts.created_at, source_alerts.status, source_alerts.attempts, source_alerts.next_attempt_at, source_alerts.last_error, source_alerts.sent_at, source_alerts.locked_until, source_alerts.claimed_by, source_alerts.claim_token, utc_timestamp(6) AS claim_clock
FROM source_alerts
WHERE source_alerts.status IN ('pending', 'failed') AND source_alerts.locked_until IS NULL AND source_alerts.next_attempt_at <= utc_timestamp(6) ORDER BY source_alerts.next_attempt_at ASC, source_alerts.id ASC
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim
-- served by pk_source_alerts (the ids the locking reads took, in the same transaction)
UPDATE source_alerts SET attempts=(source_alerts.attempts + 1), locked_until=%(claim_until)s, claimed_by=%(claim_worker)s, claim_token=%(claim_token)s WHERE source_alerts.id IN (__[POSTCOMPILE_claim_ids]);

-- complete (sets status, sent_at, last_error)
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET status=%(set_status)s, last_error=%(set_last_error)s, sent_at=%(set_sent_at)s, locked_until=%(locked_until)s, claimed_by=%(claimed_by)s, claim_token=%(claim_token)s WHERE source_alerts.id IN (__[POSTCOMPILE_ids]) AND source_alerts.claim_token = %(fence_token)s AND source_alerts.claimed_by = %(fence_worker)s;

-- extend
-- served by pk_source_alerts (the ids held), fenced by claim_token and claimed_by
UPDATE source_alerts SET locked_until=%(claim_until)s WHERE source_alerts.id IN (__[POSTCOMPILE_ids]) AND source_alerts.claim_token = %(fence_token)s AND source_alerts.claimed_by = %(fence_worker)s AND source_alerts.locked_until > %(claim_now)s;
