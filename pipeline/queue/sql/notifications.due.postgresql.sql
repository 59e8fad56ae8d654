-- Queue notifications.due on postgresql: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_notifications_due_free (rows never leased, in the queue's order) and ix_notifications_due_leased (expired leases, oldest first); the update by pk_notifications
WITH expired AS MATERIALIZED
(SELECT notifications.id AS id
FROM notifications
WHERE notifications.status IN ('pending', 'failed') AND notifications.locked_until IS NOT NULL AND notifications.locked_until <= now() AND notifications.next_attempt_at <= now() ORDER BY notifications.locked_until
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
free AS MATERIALIZED
(SELECT notifications.id AS id
FROM notifications
WHERE notifications.status IN ('pending', 'failed') AND notifications.locked_until IS NULL AND notifications.next_attempt_at <= now() ORDER BY notifications.next_attempt_at ASC, notifications.id ASC
 LIMIT %(claim_limit)s::INTEGER FOR NO KEY UPDATE SKIP LOCKED),
c AS MATERIALIZED
(SELECT expired.id AS id
FROM expired UNION ALL SELECT free.id AS id
FROM free
 LIMIT %(claim_limit)s::INTEGER)
 UPDATE notifications SET attempts=(notifications.attempts + 1), locked_until=(now() + %(claim_lease)s), claimed_by=%(claim_worker)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM c WHERE notifications.id = c.id RETURNING notifications.id, notifications.user_id, notifications.listing_id, notifications.filter_id, notifications.channel, notifications.status, notifications.attempts, notifications.next_attempt_at, notifications.last_error, notifications.created_at, notifications.sent_at, notifications.item_key, notifications.cluster_id, notifications.event, notifications.digest_id, notifications.locked_until, notifications.claimed_by, notifications.claim_token;

-- complete (sets status, sent_at, last_error)
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET status=%(set_status)s::VARCHAR, last_error=%(set_last_error)s::VARCHAR, sent_at=%(set_sent_at)s::TIMESTAMP WITH TIME ZONE, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR WHERE notifications.id = ANY (%(ids)s::BIGINT[]) AND notifications.claim_token = %(fence_token)s::VARCHAR AND notifications.claimed_by = %(fence_worker)s::VARCHAR RETURNING notifications.id;

-- complete_each (sets status, sent_at, last_error)
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET status=anon_1.status, last_error=anon_1.last_error, sent_at=anon_1.sent_at, locked_until=%(locked_until)s::TIMESTAMP WITH TIME ZONE, claimed_by=%(claimed_by)s::VARCHAR, claim_token=%(claim_token)s::VARCHAR FROM jsonb_to_recordset(CAST(%(rows)s::VARCHAR AS JSONB)) AS anon_1(id BIGINT, fence_token TEXT, fence_worker TEXT, status VARCHAR(8), sent_at TIMESTAMP WITH TIME ZONE, last_error TEXT) WHERE notifications.id = anon_1.id AND notifications.claim_token = anon_1.fence_token AND notifications.claimed_by = anon_1.fence_worker RETURNING notifications.id;

-- extend
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET locked_until=(now() + %(claim_lease)s) WHERE notifications.id = ANY (%(ids)s::BIGINT[]) AND notifications.claim_token = %(fence_token)s::VARCHAR AND notifications.claimed_by = %(fence_worker)s::VARCHAR AND notifications.locked_until > now() RETURNING notifications.id;
