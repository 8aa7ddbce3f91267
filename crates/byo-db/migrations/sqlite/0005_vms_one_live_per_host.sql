-- One live instance per host: pick_hosts_for_gpu excludes any host holding a live vms row
-- (E2, G.2), so two creates racing for one free host must not both land. The index that
-- served the picker becomes the rule itself, binding every writer.
drop index vms_live_host;
create unique index vms_one_live_per_host on vms (host_id) where deleted_at is null and creation_failed_at is null;
