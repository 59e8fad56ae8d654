-- Queue listings.unmatched on sqlite: the statements pipeline/queue/claim.py sends,
-- rendered by tests/test_golden_sql.py (which fails when they change).

-- claim
-- served by ix_listings_unmatched_free (rows never leased, in the queue's order) and ix_listings_unmatched_leased (expired leases, oldest first); the update by pk_listings
UPDATE listings SET locked_until=?, claimed_by=?, claim_token=? WHERE listings.id IN (SELECT anon_1.id
FROM (SELECT listings.id AS id
FROM listings
WHERE listings.matched_at IS NULL AND listings.locked_until IS NOT NULL AND listings.locked_until <= ? ORDER BY listings.locked_until
 LIMIT ? OFFSET ?) AS anon_1 UNION ALL SELECT anon_2.id
FROM (SELECT listings.id AS id
FROM listings
WHERE listings.matched_at IS NULL AND listings.locked_until IS NULL ORDER BY listings.updated_at ASC, listings.id ASC
 LIMIT ? OFFSET ?) AS anon_2
 LIMIT ? OFFSET ?) RETURNING id, source_id, source_item_id, url, title, summary, author, published_at, categories, content_hash, ingested_at, updated_at, matched_at, raw_id, item_key, locked_until, claimed_by, claim_token, cluster_id, simhash, gone_at, story_key, story_band_0, story_band_1, story_band_2, story_band_3, price, fields, words, missed;

-- complete (sets matched_at)
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET matched_at=?, locked_until=?, claimed_by=?, claim_token=? WHERE listings.id IN (__[POSTCOMPILE_ids]) AND listings.claim_token = ? AND listings.claimed_by = ? RETURNING id;

-- extend
-- served by pk_listings (the ids held), fenced by claim_token and claimed_by
UPDATE listings SET locked_until=? WHERE listings.id IN (__[POSTCOMPILE_ids]) AND listings.claim_token = ? AND listings.claimed_by = ? AND listings.locked_until > ? RETURNING id;
