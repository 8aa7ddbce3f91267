-- Issue #38 (4): the customer's path walked before a customer walks it (the design's set-aside
-- list, "the backend has never used the customer's own path (F) before a customer does"). One
-- row per walk: a scratch instance made on the host, logged in to over ssh through the relay as
-- a customer would, deleted. Activation reads the newest; a failed one blocks it unless the
-- operator overrides with a reason (audited on host.activate).
create table path_walks (
  id          text not null primary key,
  host_id     text not null references hosts (id),
  -- The scratch instance's name: the heartbeat's orphan removal passes over it while the walk
  -- runs, and removes it like any orphan once the walk has ended.
  vm_name     text not null,
  -- Who asked: the operator (from the host's page, the API, or by activating).
  by_sub      text,
  started_at  timestamptz not null,
  finished_at timestamptz,
  passed      boolean,
  -- Where a failed walk stopped: making the instance, logging in to it, or deleting it (null for
  -- a walk that never ended, closed when the next one starts).
  stage       text,
  error       text,
  create_ms   integer,
  ssh_ms      integer,
  delete_ms   integer,
  constraint path_walks_ended_with_a_verdict check ((finished_at is null) = (passed is null)),
  constraint path_walks_stage_closed_set check (stage is null or stage in ('create', 'ssh', 'delete')),
  constraint path_walks_error_bounded check (error is null or length(error) <= 1000)
);
-- One walk of a host at a time.
create unique index path_walks_one_running on path_walks (host_id) where finished_at is null;
create index path_walks_host_started_at on path_walks (host_id, started_at);
