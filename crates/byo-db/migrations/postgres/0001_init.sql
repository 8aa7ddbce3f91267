-- byo schema, PostgreSQL. The SQLite twin is migrations/sqlite/0001_init.sql; a test
-- proves both define the same tables, columns, keys, uniques, checks and triggers.
-- Table and column names are the design's. Timestamps are always bound by the
-- application (time is passed in), so no column relies on a database clock.

create table users (
  sub           text not null primary key,
  email         text not null,
  display_name  text not null default '',
  password_hash text not null,
  created_at    timestamptz not null,
  disabled_at   timestamptz,
  constraint users_email_key unique (email)
);

create table user_roles (
  user_sub   text not null references users(sub) on delete cascade,
  role       text not null,
  granted_by text references users(sub) on delete set null,
  granted_at timestamptz not null,
  primary key (user_sub, role),
  constraint user_roles_role_known check (role in ('superadmin', 'operator', 'community_host'))
);

-- Only the SHA-256 of a session token is stored.
create table sessions (
  token_hash text not null primary key,
  user_sub   text not null references users(sub) on delete cascade,
  created_at timestamptz not null,
  expires_at timestamptz not null
);
create index sessions_user_sub on sessions (user_sub);

create table audit_log (
  id        text not null primary key,
  at        timestamptz not null,
  actor_sub text references users(sub) on delete set null,
  action    text not null,
  target    text,
  details   jsonb not null default '{}'
);
create index audit_log_at on audit_log (at);

-- The plan for a kind of host, written once. staff_only is a column, being policy.
create table host_profiles (
  id          text not null primary key,
  gpu_type    text not null,
  description text not null default '',
  constants   jsonb not null,
  staff_only  boolean not null default false,
  created_at  timestamptz not null
);

-- A host is its relay's record too: there is no relays table.
create table hosts (
  id                 text not null primary key,
  slug               text not null,
  owner_sub          text not null references users(sub),
  profile_id         text not null references host_profiles(id),
  gpu_type           text not null,
  active             boolean not null default false,
  dedicated          boolean not null default false,
  dedicated_to       text references users(sub),
  placement          text,
  prepare_state      jsonb,
  prepared_at        timestamptz,
  agent_token        text,           -- sealed with the server key, never plaintext
  token_hash         text,           -- sha256 of the token the host presents to us
  ssh_map_token_hash text,
  pubkey             text,           -- the host's WireGuard public key, set at redeem
  lockout_owner      boolean not null default false,
  relay_name         text,
  relay_ip           text,
  relay_state        text,
  relay_error        text,
  tunnel_id          text,
  tunnel_hostname    text,
  agent_version      text,
  created_at         timestamptz not null,
  activated_at       timestamptz,
  activated_by       text references users(sub),
  retired_at         timestamptz,
  constraint hosts_slug_key unique (slug),
  constraint hosts_token_hash_key unique (token_hash),
  -- N.6: a retired host is held inactive and undedicated for every writer.
  constraint hosts_retired_inactive check (retired_at is null or (active = false and dedicated = false)),
  -- D.3: the backend refuses to activate a host whose preparation did not finish.
  constraint hosts_active_prepared check (active = false or prepared_at is not null)
);
create index hosts_owner_sub on hosts (owner_sub);

create table host_enrollments (
  id               text not null primary key,
  host_id          text references hosts(id) on delete set null,
  owner_sub        text not null references users(sub),
  profile_id       text not null references host_profiles(id),
  state            text not null,
  token_hash       text,
  token_expires_at timestamptz not null,
  wg_config        text,             -- sealed; cleared on release
  fingerprint      jsonb,
  reject_reason    text,
  created_at       timestamptz not null,
  redeemed_at      timestamptz,
  released_at      timestamptz,
  constraint host_enrollments_token_hash_key unique (token_hash),
  constraint host_enrollments_state_known check (state in ('pending', 'ready', 'enrolled', 'rejected', 'revoked', 'expired', 'released'))
);
create index host_enrollments_owner_sub on host_enrollments (owner_sub);

-- The design's DDL, plus retired_at: hardware_id is unique among nodes that are not
-- retired (N.7), which a partial index can say only with the flag on this row. The
-- hosts_retire_nodes trigger keeps it equal to the host's retired_at.
create table host_nodes (
  host_id       text not null references hosts(id) on delete cascade,
  "index"       int  not null,
  machine_id    text,
  hardware_id   text not null,
  fingerprint   jsonb not null,
  rails         jsonb not null default '{}',
  prepare_state jsonb,
  seen_at       timestamptz,
  created_at    timestamptz not null default now(),
  retired_at    timestamptz,
  primary key (host_id, "index")
);
create unique index host_nodes_hardware_id_live on host_nodes (hardware_id) where retired_at is null;

create function hosts_retire_nodes() returns trigger language plpgsql as $$
begin
  update host_nodes set retired_at = new.retired_at where host_id = new.id;
  return new;
end $$;
create trigger hosts_retire_nodes after update of retired_at on hosts
  for each row when (new.retired_at is not null) execute function hosts_retire_nodes();

create table host_status (
  host_id       text not null primary key references hosts(id) on delete cascade,
  seen_at       timestamptz not null,
  agent_version text,
  lxd           text,
  relay         text,
  tunnel        text,
  gpu           text,
  storage       text,
  instances     int,
  details       jsonb not null default '{}'
);

create table vms (
  id                  text not null primary key,
  user_sub            text not null references users(sub),
  host_id             text references hosts(id),
  name                text not null,
  gpu_type            text not null,
  ssh_hostname        text,
  ssh_port            int,
  status              text not null default 'creating',
  queue_id            text,
  prebooking_id       text,
  created_at          timestamptz not null,
  creation_failed_at  timestamptz,
  delete_requested_at timestamptz,
  deleted_at          timestamptz
);
-- pick_hosts_for_gpu excludes any host holding a live row.
create index vms_live_host on vms (host_id) where deleted_at is null and creation_failed_at is null;
create index vms_user_sub on vms (user_sub);
-- notify-stuck-deletes: requested and not gone.
create index vms_stuck_deletes on vms (delete_requested_at) where deleted_at is null and delete_requested_at is not null;

-- The general queue: intents waiting for capacity (E2).
create table vm_queue (
  id            text not null primary key,
  user_sub      text not null references users(sub),
  gpu_type      text not null,
  ssh_key_id    text,
  created_at    timestamptz not null,
  attempts      int not null default 0,
  claimed_until timestamptz,
  vm_id         text references vms(id),
  closed_at     timestamptz,
  close_reason  text
);
create index vm_queue_open on vm_queue (gpu_type, created_at) where closed_at is null;

-- Pre-bookings (E3): a named box for a date range, pinned at booking time.
create table prebookings (
  id             text not null primary key,
  user_sub       text not null references users(sub),
  host_id        text references hosts(id),
  gpu_type       text not null,
  start_date     timestamptz not null,
  end_date       timestamptz not null,
  paid_at        timestamptz,
  launched_vm_id text references vms(id),
  closed_at      timestamptz,
  created_at     timestamptz not null,
  constraint prebookings_window check (end_date > start_date)
);

create table ssh_keys (
  id          text not null primary key,
  user_sub    text not null references users(sub) on delete cascade,
  name        text not null,
  public_key  text not null,
  fingerprint text not null,
  created_at  timestamptz not null,
  constraint ssh_keys_user_fingerprint_key unique (user_sub, fingerprint)
);

-- Each operator key's fingerprint against the operator's user sub, so an sshd login
-- as spark is attributable (I).
create table operator_keys (
  id          text not null primary key,
  user_sub    text not null references users(sub),
  label       text not null,
  public_key  text not null,
  fingerprint text not null,
  created_at  timestamptz not null,
  removed_at  timestamptz
);
create unique index operator_keys_fingerprint_live on operator_keys (fingerprint) where removed_at is null;

-- The signed operator-key lists (M), one row per version, kept as the exact bytes.
create table operator_key_lists (
  version      int not null primary key,
  state        text not null,
  body         text not null,
  envelope     text,
  created_at   timestamptz not null,
  created_by   text references users(sub),
  published_at timestamptz,
  published_by text references users(sub),
  constraint operator_key_lists_state_known check (state in ('draft', 'published')),
  constraint operator_key_lists_signed check (state = 'draft' or envelope is not null)
);

create table operator_key_changes (
  id          text not null primary key,
  version     int not null references operator_key_lists(version) on delete cascade,
  user_sub    text not null references users(sub),
  action      text not null,
  fingerprint text not null,
  label       text not null,
  at          timestamptz not null,
  constraint operator_key_changes_action_known check (action in ('add', 'remove'))
);

-- Per host: the list version it holds, or why the last push failed.
create table host_key_pushes (
  host_id      text not null primary key references hosts(id) on delete cascade,
  version      int,
  attempted_at timestamptz not null,
  error        text
);
