-- Issue #39 (2): the queue has an end. An open row carries when it lapses (`expires_at`,
-- written by the enqueue as created_at plus the configured age, moved by the customer's
-- "keep waiting"); the expire-queue job closes a lapsed row no attempt of which is live,
-- with the reason 'expired'. Rows open when this runs lapse 72 hours (the default age)
-- after they were queued.
alter table vm_queue add column expires_at timestamptz;
update vm_queue set expires_at = created_at + interval '72 hours';
alter table vm_queue alter column expires_at set not null;
alter table vm_queue drop constraint vm_queue_close_reason_closed_set;
alter table vm_queue add constraint vm_queue_close_reason_closed_set
  check (close_reason in ('placed', 'placed_by_operator', 'cancelled', 'closed_by_operator', 'expired'));
-- The expiry sweep's read: open rows by when they lapse.
create index vm_queue_expiring on vm_queue (expires_at) where closed_at is null;
-- A customer's ended rows, latest first (what /instances tells them about).
create index vm_queue_user_closed on vm_queue (user_sub, closed_at) where closed_at is not null;
