-- Issue #40 (6): owners paid their share through Stripe Connect. An owner connects a Stripe
-- account (an Express account made once per owner under the key connect-account-<sub>, its
-- onboarding on Stripe's pages); whether it can receive transfers is asked of Stripe live
-- before each payout and kept here only to show it.
create table payout_accounts (
  user_sub          text not null primary key references users(sub),
  stripe_account_id text not null,
  transfers_active  boolean not null default false,
  checked_at        timestamptz,
  created_at        timestamptz not null,
  constraint payout_accounts_stripe_account_id_key unique (stripe_account_id)
);

-- A payout: the owner's share of every charge and credit on their hosts whose invoice was
-- paid before the first of the month after `month`, and that no payout took before — marked
-- with this row's id in the transaction that makes it, so a line is paid out at most once
-- and a line paid late goes into the next month's payout. At most one per owner and month.
-- The amount is fixed when the row is made (each line split at owner_share_bps, the owner's
-- part truncated toward zero as the earnings page shows it); the transfer is POST
-- /v1/transfers under the key payout-<id>, retried with backoff until Stripe takes it.
create table payouts (
  id                 text not null primary key,
  user_sub           text not null references users(sub),
  month              text not null,
  stripe_account_id  text not null,
  amount_cents       bigint not null,
  currency           text not null,
  owner_share_bps    integer not null,
  status             text not null,
  stripe_transfer_id text,
  attempts           integer not null default 0,
  last_error         text,
  next_attempt_at    timestamptz not null,
  created_at         timestamptz not null,
  paid_at            timestamptz,
  updated_at         timestamptz not null,
  constraint payouts_one_per_owner_month unique (user_sub, month),
  constraint payouts_stripe_transfer_id_key unique (stripe_transfer_id),
  constraint payouts_status_known check (status in ('pending', 'paid')),
  constraint payouts_amount_positive check (amount_cents > 0)
);
-- The job's worklist: payouts still to transfer, by when they are next tried.
create index payouts_pending on payouts (next_attempt_at) where status = 'pending';

alter table usage_charges add column payout_id text references payouts(id);
alter table refunds add column payout_id text references payouts(id);
create index usage_charges_not_paid_out on usage_charges (invoice_id) where payout_id is null;
create index refunds_not_paid_out on refunds (invoice_id) where payout_id is null;
