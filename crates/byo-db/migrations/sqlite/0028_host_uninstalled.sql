-- (SQLite twin of postgres/0028_host_uninstalled.sql.)
-- Issue #39 (3): leaving gives everything back. When `byo-agent uninstall` finishes on a host,
-- the agent says so (`POST /api/host/uninstalled`, with the host token it still holds): the
-- host is stopped as its owner's stop-hosting stops it, its instances (which the uninstall
-- deleted) end, and `uninstalled_at` is stamped, so `retire-stopped` retires it at its next
-- run instead of after a silent day.
alter table hosts add column uninstalled_at timestamptz;
