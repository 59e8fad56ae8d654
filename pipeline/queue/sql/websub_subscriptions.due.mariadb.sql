-- Queue websub_subscriptions.due on mariadb: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim_expired
-- served by ix_websub_subscriptions_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT websub_subscriptions.id, websub_subscriptions.source_id, websub_subscriptions.hub, websub_subscriptions.topic, websub_subscriptions.callback_token, websub_subscriptions.secret, websub_subscriptions.previous_secret, websub_subscriptions.previous_secret_until, websub_subscriptions.secret_since, websub_subscriptions.state, websub_subscriptions.requested_at, websub_subscriptions.verified_at, websub_subscriptions.lease_until, websub_subscriptions.pushes, websub_subscriptions.last_push_at, websub_subscriptions.missed, websub_subscriptions.missed_at, websub_subscriptions.last_error, websub_subscriptions.due_at, websub_subscriptions.attempts, websub_subscriptions.locked_until, websub_subscriptions.claimed_by, websub_subscriptions.claim_token, utc_timestamp(6) AS claim_clock
FROM websub_subscriptions
WHERE websub_subscriptions.due_at IS NOT NULL AND websub_subscriptions.locked_until IS NOT NULL AND websub_subscriptions.locked_until <= utc_timestamp(6) AND websub_subscriptions.due_at <= utc_timestamp(6) ORDER BY websub_subscriptions.locked_until
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim_free
-- served by ix_websub_subscriptions_due_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT websub_subscriptions.id, websub_subscriptions.source_id, websub_subscriptions.hub, websub_subscriptions.topic, websub_subscriptions.callback_token, websub_subscriptions.secret, websub_subscriptions.previous_secret, websub_subscriptions.previous_secret_until, websub_subscriptions.secret_since, websub_subscriptions.state, websub_subscriptions.requested_at, websub_subscriptions.verified_at, websub_subscriptions.lease_until, websub_subscriptions.pushes, websub_subscriptions.last_push_at, websub_subscriptions.missed, websub_subscriptions.missed_at, websub_subscriptions.last_error, websub_subscriptions.due_at, websub_subscriptions.attempts, websub_subscriptions.locked_until, websub_subscriptions.claimed_by, websub_subscriptions.claim_token, utc_timestamp(6) AS claim_clock
FROM websub_subscriptions
WHERE websub_subscriptions.due_at IS NOT NULL AND websub_subscriptions.locked_until IS NULL AND websub_subscriptions.due_at <= utc_timestamp(6) ORDER BY websub_subscriptions.due_at ASC, websub_subscriptions.id ASC
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim
-- served by pk_websub_subscriptions (the ids the locking reads took, in the same transaction)
UPDATE websub_subscriptions SET attempts=(websub_subscriptions.attempts + 1), locked_until=%(claim_until)s, claimed_by=%(claim_worker)s, claim_token=%(claim_token)s WHERE websub_subscriptions.id IN (__[POSTCOMPILE_claim_ids]);

-- complete (sets state, requested_at, due_at, last_error)
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET state=%(set_state)s, requested_at=%(set_requested_at)s, last_error=%(set_last_error)s, due_at=%(set_due_at)s, locked_until=%(locked_until)s, claimed_by=%(claimed_by)s, claim_token=%(claim_token)s WHERE websub_subscriptions.id IN (__[POSTCOMPILE_ids]) AND websub_subscriptions.claim_token = %(fence_token)s AND websub_subscriptions.claimed_by = %(fence_worker)s;

-- extend
-- served by pk_websub_subscriptions (the ids held), fenced by claim_token and claimed_by
UPDATE websub_subscriptions SET locked_until=%(claim_until)s WHERE websub_subscriptions.id IN (__[POSTCOMPILE_ids]) AND websub_subscriptions.claim_token = %(fence_token)s AND websub_subscriptions.claimed_by = %(fence_worker)s AND websub_subscriptions.locked_until > %(claim_now)s;
