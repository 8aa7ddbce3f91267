-- Placement's memory of each host (issue #12, item 6): how many creates in a row it
-- failed (refused, or could not be reached), why the last one failed, and when it was
-- benched for it. pick_hosts_for_gpu skips a benched host until a heartbeat later than the
-- bench arrives or an operator clears it; a create the host takes resets the count.
create table host_placement (
  host_id              text not null primary key references hosts(id) on delete cascade,
  consecutive_failures integer not null default 0,
  last_failure         text,
  last_failure_at      timestamptz,
  benched_at           timestamptz,
  constraint host_placement_failures_counted check (consecutive_failures >= 0),
  constraint host_placement_benched_after_failures check (benched_at is null or consecutive_failures > 0)
);
