-- Queue notifications.due on mariadb: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim_expired
-- served by ix_notifications_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT notifications.id, notifications.user_id, notifications.listing_id, notifications.filter_id, notifications.channel, notifications.status, notifications.attempts, notifications.next_attempt_at, notifications.last_error, notifications.created_at, notifications.sent_at, notifications.item_key, notifications.cluster_id, notifications.event, notifications.digest_id, notifications.locked_until, notifications.claimed_by, notifications.claim_token, utc_timestamp(6) AS claim_clock
FROM notifications
WHERE notifications.status IN ('pending', 'failed') AND notifications.locked_until IS NOT NULL AND notifications.locked_until <= utc_timestamp(6) AND notifications.next_attempt_at <= utc_timestamp(6) ORDER BY notifications.locked_until
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim_free
-- served by ix_notifications_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT notifications.id, notifications.user_id, notifications.listing_id, notifications.filter_id, notifications.channel, notifications.status, notifications.attempts, notifications.next_attempt_at, notifications.last_error, notifications.created_at, notifications.sent_at, notifications.item_key, notifications.cluster_id, notifications.event, notifications.digest_id, notifications.locked_until, notifications.claimed_by, notifications.claim_token, utc_timestamp(6) AS claim_clock
FROM notifications
WHERE notifications.status IN ('pending', 'failed') AND notifications.locked_until IS NULL AND notifications.next_attempt_at <= utc_timestamp(6) ORDER BY notifications.next_attempt_at ASC, notifications.id ASC
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim
-- served by pk_notifications (the ids the locking reads took, in the same transaction)
UPDATE notifications SET attempts=(notifications.attempts + 1), locked_until=%(claim_until)s, claimed_by=%(claim_worker)s, claim_token=%(claim_token)s WHERE notifications.id IN (__[POSTCOMPILE_claim_ids]);

-- complete (sets status, sent_at, last_error)
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET status=%(set_status)s, last_error=%(set_last_error)s, sent_at=%(set_sent_at)s, locked_until=%(locked_until)s, claimed_by=%(claimed_by)s, claim_token=%(claim_token)s WHERE notifications.id IN (__[POSTCOMPILE_ids]) AND notifications.claim_token = %(fence_token)s AND notifications.claimed_by = %(fence_worker)s;

-- extend
-- served by pk_notifications (the ids held), fenced by claim_token and claimed_by
UPDATE notifications SET locked_until=%(claim_until)s WHERE notifications.id IN (__[POSTCOMPILE_ids]) AND notifications.claim_token = %(fence_token)s AND notifications.claimed_by = %(fence_worker)s AND notifications.locked_until > %(claim_now)s;
