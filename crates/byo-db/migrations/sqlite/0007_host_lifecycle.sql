-- Life after go-live (issue #12). De-pool: why a host was taken out of placement, when and
-- by whom (the audit log keeps every one; the row keeps the latest for the pages).
-- Revoke of an enrolled host (H): recorded as it goes, so a host that does not confirm its
-- drain leaves the revoke visibly in progress at the step it reached, and running revoke
-- again resumes it. A host being revoked, or revoked, is held inactive for every writer.
-- Replace a dead relay (A.3): the relay's WireGuard key, sealed with the server key, so a
-- new relay can be booted that the host's tunnel already trusts.
alter table hosts add column depooled_at timestamptz;
alter table hosts add column depooled_by text references users(sub);
alter table hosts add column depool_reason text constraint hosts_depool_reason_bounded check (depool_reason is null or length(depool_reason) between 1 and 500);
alter table hosts add column revoke_requested_at timestamptz constraint hosts_revoked_inactive check (revoke_requested_at is null or active = false);
alter table hosts add column revoke_step text constraint hosts_revoke_step_known check (revoke_step is null or revoke_step in ('draining', 'removing_access', 'revoked'));
alter table hosts add column revoked_at timestamptz;
alter table hosts add column relay_wg_key text;
