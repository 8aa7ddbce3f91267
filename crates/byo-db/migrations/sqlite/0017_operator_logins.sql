-- Issue #16 (5): attributable logins (I, "What the operator gets"). Every operator logs in
-- as spark with their own key; the agent reads sshd's accepted logins from the journal,
-- attributes each by fingerprint against the key list the host applied, and sends them on
-- the heartbeat. One row per login: a beat sent again adds nothing (operator_logins_once).
-- user_sub is the list's entry for the key, or null for a key on no list ("not an operator
-- key"); it is no foreign key, so a departed operator's logins stay attributable. Only the
-- newest logins of each host are kept (the heartbeat trims after each insert).
create table operator_logins (
  id           text not null primary key,
  host_id      text not null references hosts(id) on delete cascade,
  logged_in_at timestamptz not null,
  source       text not null,
  source_port  integer not null,
  fingerprint  text not null,
  user_sub     text,
  reported_at  timestamptz not null,
  constraint operator_logins_once unique (host_id, logged_in_at, source, source_port),
  constraint operator_logins_source_bounded check (length(source) between 2 and 45),
  constraint operator_logins_source_port_range check (source_port between 0 and 65535),
  constraint operator_logins_fingerprint_bounded check (length(fingerprint) between 8 and 80),
  constraint operator_logins_user_sub_bounded check (user_sub is null or length(user_sub) between 1 and 128)
);
create index operator_logins_host_logged_in_at on operator_logins (host_id, logged_in_at);
