-- Issue #13 (2): the queue (E2). A queued row is step 58's row with no host: the customer's
-- intent (gpu_type, the key to install) and nothing else; no vms row exists for it until a
-- drain attempt writes one with the host it is about to contact. The table existed since
-- 0001 and nothing ever wrote it, so it is made again with the rules as constraints:
-- a drainer's lease (claimed_until, claim_token), the attempt in flight or placed (vm_id),
-- why the last attempt did not place it (last_error: billing refused, staff-only, no key),
-- and a closed set of endings, each with its reason and a placed row naming its instance.
drop index vm_queue_open;
drop table vm_queue;
create table vm_queue (
  id            text not null primary key,
  user_sub      text not null references users(sub),
  gpu_type      text not null,
  ssh_key_id    text not null,
  created_at    timestamptz not null,
  attempts      int not null default 0,
  claimed_until timestamptz,
  claim_token   text,
  vm_id         text references vms(id),
  last_error    text,
  last_error_at timestamptz,
  closed_at     timestamptz,
  close_reason  text,
  constraint vm_queue_closed_with_reason check ((closed_at is null) = (close_reason is null)),
  constraint vm_queue_close_reason_closed_set
    check (close_reason in ('placed', 'placed_by_operator', 'cancelled', 'closed_by_operator')),
  constraint vm_queue_placed_names_its_instance
    check (close_reason not in ('placed', 'placed_by_operator') or vm_id is not null),
  constraint vm_queue_attempts_counted check (attempts >= 0)
);
create index vm_queue_open on vm_queue (created_at, id) where closed_at is null;
-- One queued row per instance: an attempt's vms row belongs to exactly one queue row.
create unique index vm_queue_one_row_per_vm on vm_queue (vm_id) where vm_id is not null;
create index vm_queue_user_open on vm_queue (user_sub) where closed_at is null;
