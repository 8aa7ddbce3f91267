-- Issue #16: a departure (every key of an operator whose role was revoked) and a signing-key
-- rotation (M.13) are changes to the draft too, recorded beside adds and removes. SQLite
-- cannot alter a check: the table is rebuilt with the same columns in the same order.
create table operator_key_changes_widened (
  id          text not null primary key,
  version     integer not null references operator_key_lists(version) on delete cascade,
  user_sub    text not null references users(sub),
  action      text not null,
  fingerprint text not null,
  label       text not null,
  at          timestamptz not null,
  constraint operator_key_changes_action_known check (action in ('add', 'remove', 'depart', 'rotate', 'renew'))
);
insert into operator_key_changes_widened (id, version, user_sub, action, fingerprint, label, at)
  select id, version, user_sub, action, fingerprint, label, at from operator_key_changes;
drop table operator_key_changes;
alter table operator_key_changes_widened rename to operator_key_changes;
