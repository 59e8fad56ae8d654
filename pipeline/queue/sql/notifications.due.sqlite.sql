-- Queue notifications.due on sqlite: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_notifications_due_free (rows never leased, in the queue's order) and ix_notifications_due_leased (expired leases, oldest first); the update by pk_notifications
UPDATE notifications SET attempts=(notifications.attempts + 1), locked_until=?, claimed_by=?, claim_token=? WHERE notifications.id IN (SELECT anon_1.id
FROM (SELECT notifications.id AS id
FROM notifications
WHERE notifications.status IN ('pending', 'failed') AND notifications.locked_until IS NOT NULL AND notifications.locked_until <= ? AND notifications.next_attempt_at <= ? ORDER BY notifications.locked_until
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id
FROM (SELECT notifications.id AS id
FROM notifications
WHERE notifications.status IN ('pending', 'failed') AND notifications.locked_until IS NULL AND notifications.next_attempt_at <= ? ORDER BY notifications.next_attempt_at ASC, notifications.id ASC
 LIMIT ? OFFSET ?) AS anon_2
 LIMIT ? OFFSET ?) RETURNING id, user_id, listing_id, filter_id, channel, status, attempts, next_attempt_at, last_error, created_at, sent_at, item_key, cluster_id, event, digest_id, locked_until, claimed_by, claim_token;

-- complete (sets status, sent_at, last_error)
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET status=?, last_error=?, sent_at=?, locked_until=?, claimed_by=?, claim_token=? WHERE notifications.id IN (__[POSTCOMPILE_ids]) AND notifications.claim_token = ? AND notifications.claimed_by = ? RETURNING id;

-- extend
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET locked_until=? WHERE notifications.id IN (__[POSTCOMPILE_ids]) AND notifications.claim_token = ? AND notifications.claimed_by = ? AND notifications.locked_until > ? RETURNING id;
