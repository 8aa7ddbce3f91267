-- Issue #39 (2): the queue has an end. An open row carries when it lapses (`expires_at`,
-- written by the enqueue as created_at plus the configured age, moved by the customer's
-- "keep waiting"); the expire-queue job closes a lapsed row no attempt of which is live,
-- with the reason 'expired'. Rows open when this runs lapse 72 hours (the default age)
-- after they were queued. SQLite cannot alter a check, so the table is made again, as
-- 0011 made it, with the column last (as PostgreSQL's `add column` puts it). The backfill
-- is written as sqlx writes a timestamp (`+00:00`, not `Z`): SQLite compares them as text.
create table vm_queue_new (
  id            text not null primary key,
  user_sub      text not null references users(sub),
  gpu_type      text not null,
  ssh_key_id    text not null,
  created_at    timestamptz not null,
  attempts      integer not null default 0,
  claimed_until timestamptz,
  claim_token   text,
  vm_id         text references vms(id),
  last_error    text,
  last_error_at timestamptz,
  closed_at     timestamptz,
  close_reason  text,
  expires_at    timestamptz not null,
  constraint vm_queue_closed_with_reason check ((closed_at is null) = (close_reason is null)),
  constraint vm_queue_close_reason_closed_set
    check (close_reason in ('placed', 'placed_by_operator', 'cancelled', 'closed_by_operator', 'expired')),
  constraint vm_queue_placed_names_its_instance
    check (close_reason not in ('placed', 'placed_by_operator') or vm_id is not null),
  constraint vm_queue_attempts_counted check (attempts >= 0)
);
insert into vm_queue_new (id, user_sub, gpu_type, ssh_key_id, created_at, attempts, claimed_until,
                          claim_token, vm_id, last_error, last_error_at, closed_at, close_reason,
                          expires_at)
  select id, user_sub, gpu_type, ssh_key_id, created_at, attempts, claimed_until, claim_token,
         vm_id, last_error, last_error_at, closed_at, close_reason,
         strftime('%Y-%m-%dT%H:%M:%f+00:00', created_at, '+72 hours')
  from vm_queue;
drop index vm_queue_open;
drop index vm_queue_one_row_per_vm;
drop index vm_queue_user_open;
drop index vm_queue_claimed;
drop table vm_queue;
alter table vm_queue_new rename to vm_queue;
create index vm_queue_open on vm_queue (created_at, id) where closed_at is null;
create unique index vm_queue_one_row_per_vm on vm_queue (vm_id) where vm_id is not null;
create index vm_queue_user_open on vm_queue (user_sub) where closed_at is null;
create index vm_queue_claimed on vm_queue (claim_token) where claim_token is not null;
-- The expiry sweep's read: open rows by when they lapse.
create index vm_queue_expiring on vm_queue (expires_at) where closed_at is null;
-- A customer's ended rows, latest first (what /instances tells them about).
create index vm_queue_user_closed on vm_queue (user_sub, closed_at) where closed_at is not null;
