-- Queue listings_raw.unprocessed on mariadb: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim_expired
-- served by ix_listings_raw_unprocessed_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT listings_raw.id, listings_raw.source_id, listings_raw.source_item_id, listings_raw.url, listings_raw.raw_json, listings_raw.content_hash, listings_raw.fetched_at, listings_raw.processed_at, listings_raw.attempts, listings_raw.last_error, listings_raw.locked_until, listings_raw.claimed_by, listings_raw.claim_token, utc_timestamp(6) AS claim_clock
FROM listings_raw
WHERE listings_raw.processed_at IS NULL AND listings_raw.locked_until IS NOT NULL AND listings_raw.locked_until <= utc_timestamp(6) ORDER BY listings_raw.locked_until
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim_free
-- served by ix_listings_raw_unprocessed_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT listings_raw.id, listings_raw.source_id, listings_raw.source_item_id, listings_raw.url, listings_raw.raw_json, listings_raw.content_hash, listings_raw.fetched_at, listings_raw.processed_at, listings_raw.attempts, listings_raw.last_error, listings_raw.locked_until, listings_raw.claimed_by, listings_raw.claim_token, utc_timestamp(6) AS claim_clock
FROM listings_raw
WHERE listings_raw.processed_at IS NULL AND listings_raw.locked_until IS NULL ORDER BY listings_raw.fetched_at ASC, listings_raw.id ASC
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim
-- served by pk_listings_raw (the ids the locking reads took, in the same transaction)
UPDATE listings_raw SET attempts=(listings_raw.attempts + 1), locked_until=%(claim_until)s, claimed_by=%(claim_worker)s, claim_token=%(claim_token)s WHERE listings_raw.id IN (__[POSTCOMPILE_claim_ids]);

-- complete (sets processed_at, last_error)
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET processed_at=%(set_processed_at)s, last_error=%(set_last_error)s, locked_until=%(locked_until)s, claimed_by=%(claimed_by)s, claim_token=%(claim_token)s WHERE listings_raw.id IN (__[POSTCOMPILE_ids]) AND listings_raw.claim_token = %(fence_token)s AND listings_raw.claimed_by = %(fence_worker)s;

-- extend
-- served by pk_listings_raw (the ids held), fenced by claim_token and claimed_by
UPDATE listings_raw SET locked_until=%(claim_until)s WHERE listings_raw.id IN (__[POSTCOMPILE_ids]) AND listings_raw.claim_token = %(fence_token)s AND listings_raw.claimed_by = %(fence_worker)s AND listings_raw.locked_until > %(claim_now)s;
