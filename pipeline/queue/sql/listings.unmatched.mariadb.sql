-- Queue listings.unmatched on mariadb: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim_expired
-- served by ix_listings_unmatched_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT listings.id, listings.source_id, listings.source_item_id, listings.url, listings.title, listings.summary, listings.author, listings.published_at, listings.categories, listings.content_hash, listings.ingested_at, listings.updated_at, listings.matched_at, listings.raw_id, listings.item_key, listings.locked_until, listings.claimed_by, listings.claim_token, listings.cluster_id, listings.simhash, listings.gone_at, listings.story_key, listings.story_band_0, listings.story_band_1, listings.story_band_2, listings.story_band_3, listings.price, listings.fields, listings.words, listings.missed, utc_timestamp(6) AS claim_clock
FROM listings
WHERE listings.matched_at IS NULL AND listings.locked_until IS NOT NULL AND listings.locked_until <= utc_timestamp(6) ORDER BY listings.locked_until
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim_free
-- served by ix_listings_unmatched_free (MariaDB: the pending columns and the lease lead it), a range; locking the rows taken, skipping those other claims hold
SELECT listings.id, listings.source_id, listings.source_item_id, listings.url, listings.title, listings.summary, listings.author, listings.published_at, listings.categories, listings.content_hash, listings.ingested_at, listings.updated_at, listings.matched_at, listings.raw_id, listings.item_key, listings.locked_until, listings.claimed_by, listings.claim_token, listings.cluster_id, listings.simhash, listings.gone_at, listings.story_key, listings.story_band_0, listings.story_band_1, listings.story_band_2, listings.story_band_3, listings.price, listings.fields, listings.words, listings.missed, utc_timestamp(6) AS claim_clock
FROM listings
WHERE listings.matched_at IS NULL AND listings.locked_until IS NULL ORDER BY listings.updated_at ASC, listings.id ASC
 LIMIT %(claim_limit)s FOR UPDATE SKIP LOCKED;

-- claim
-- served by pk_listings (the ids the locking reads took, in the same transaction)
UPDATE listings SET locked_until=%(claim_until)s, claimed_by=%(claim_worker)s, claim_token=%(claim_token)s WHERE listings.id IN (__[POSTCOMPILE_claim_ids]);

-- complete (sets matched_at)
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET matched_at=%(set_matched_at)s, locked_until=%(locked_until)s, claimed_by=%(claimed_by)s, claim_token=%(claim_token)s WHERE listings.id IN (__[POSTCOMPILE_ids]) AND listings.claim_token = %(fence_token)s AND listings.claimed_by = %(fence_worker)s;

-- extend
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET locked_until=%(claim_until)s WHERE listings.id IN (__[POSTCOMPILE_ids]) AND listings.claim_token = %(fence_token)s AND listings.claimed_by = %(fence_worker)s AND listings.locked_until > %(claim_now)s;
