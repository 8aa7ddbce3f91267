-- Issue #13 (benchmark): a drain run lets go of the rows it holds by its claim token, and
-- reads them by it; without an index that is a scan of every open row per run, so a run's
-- cost grew with the queue. Only claimed rows are indexed.
create index vm_queue_claimed on vm_queue (claim_token) where claim_token is not null;
