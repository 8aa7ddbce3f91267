-- Issue #14, items 1 and 5 (J, "publishing is not delivery"; note 9).
-- agent_releases: agent builds published with `byo release publish`. The server recorded a
-- row only after verifying `signature` (an SSHSIG by the release key, namespace
-- byo-agent-release@byo) over the bytes it keeps at release_dir/agent-builds/<sha256>.
-- The installer's path (/agent/byo-agent-<arch>) serves the newest row of its arch.
-- `build` is the first 12 hex of sha256: what a heartbeat's agent_version names.
create table agent_releases (
  id           text not null primary key,
  arch         text not null,
  version      text not null,
  sha256       text not null,
  build        text not null,
  signature    text not null,
  size_bytes   bigint not null,
  published_by text not null references users(sub),
  published_at timestamptz not null,
  constraint agent_releases_once unique (arch, sha256),
  constraint agent_releases_arch_bounded check (length(arch) between 1 and 32),
  constraint agent_releases_version_bounded check (length(version) between 1 and 128),
  constraint agent_releases_sha256_hex check (length(sha256) = 64),
  constraint agent_releases_build_prefix check (build = substr(sha256, 1, 12)),
  constraint agent_releases_signature_bounded check (length(signature) between 1 and 16384)
);
create index agent_releases_arch_published_at on agent_releases (arch, published_at);

-- A fleet upgrade to one build, in waves, driven from an operator's machine (the SSH runs
-- there; a server never holds an operator's key) and recorded here, so a second run resumes
-- it and /admin/releases shows it. One run is open (running or halted) at a time:
-- open_marker is 'open' while it is, null once closed, and unique.
create table fleet_upgrades (
  id           text not null primary key,
  build        text not null,
  state        text not null,
  open_marker  text,
  canary       integer not null,
  growth       integer not null,
  wait_secs    integer not null,
  halt_reason  text,
  started_by   text not null references users(sub),
  started_at   timestamptz not null,
  updated_at   timestamptz not null,
  closed_at    timestamptz,
  constraint fleet_upgrades_one_open unique (open_marker),
  constraint fleet_upgrades_state_known check (state in ('running', 'halted', 'closed')),
  constraint fleet_upgrades_open_marker_state check ((state = 'closed' and open_marker is null and closed_at is not null) or (state <> 'closed' and open_marker = 'open' and closed_at is null)),
  constraint fleet_upgrades_build_bounded check (length(build) = 12),
  constraint fleet_upgrades_halt_reason_bounded check (halt_reason is null or length(halt_reason) between 1 and 2048)
);

create table fleet_upgrade_hosts (
  run_id      text not null references fleet_upgrades(id) on delete cascade,
  host_id     text not null references hosts(id) on delete cascade,
  position    integer not null,
  wave        integer not null,
  state       text not null,
  reason      text,
  started_at  timestamptz,
  judged_at   timestamptz,
  primary key (run_id, host_id),
  constraint fleet_upgrade_hosts_state_known check (state in ('waiting', 'upgrading', 'healthy', 'failed', 'skipped')),
  constraint fleet_upgrade_hosts_upgrading_started check (state <> 'upgrading' or started_at is not null),
  constraint fleet_upgrade_hosts_reason_bounded check (reason is null or length(reason) between 1 and 2048)
);
