-- (SQLite twin of postgres/0023_invoices.sql.) -- Issue #40 (1): invoices. bill-usage leaves invoice items pending at Stripe (usage_charges,
-- refunds); an invoice collects an account's pending items, each calendar month and earlier
-- when the account's uninvoiced balance passes a threshold. The row is made here first, with
-- the charges and credits it covers marked in the same transaction; every Stripe call that
-- follows takes an Idempotency-Key derived from its id (invoice-, finalize-, pay-<id>), so
-- a job that dies between two calls finishes on its next run without a second invoice.
--
-- status is Stripe's (draft, open, paid, uncollectible, void) or pending: made here, not yet
-- at Stripe. The webhook (invoice.finalized, .paid, .payment_failed, .voided,
-- .marked_uncollectible) moves it too; a status never moves back (byo_wire::states::InvoiceStatus).
create table invoices (
  id                 text not null primary key,
  user_sub           text not null references users(sub),
  customer_id        text not null,
  reason             text not null,
  amount_cents       integer not null,
  currency           text not null,
  status             text not null,
  stripe_invoice_id  text,
  hosted_invoice_url text,
  stripe_total_cents integer,
  created_at         timestamptz not null,
  finalized_at       timestamptz,
  pay_attempted_at   timestamptz,
  payment_failed_at  timestamptz,
  paid_at            timestamptz,
  voided_at          timestamptz,
  last_error         text,
  updated_at         timestamptz not null,
  constraint invoices_stripe_invoice_id_key unique (stripe_invoice_id),
  constraint invoices_reason_known check (reason in ('month_end', 'threshold')),
  constraint invoices_status_known check (status in ('pending', 'draft', 'open', 'paid', 'uncollectible', 'void'))
);
-- At most one invoice per account not yet at Stripe: two runs cannot both make one.
create unique index invoices_one_pending_per_account on invoices (user_sub) where status = 'pending';
-- The billing page's list, newest first.
create index invoices_user_created on invoices (user_sub, created_at);

-- Which invoice took each charge and credit; null while it is pending at Stripe.
alter table usage_charges add column invoice_id text references invoices(id);
alter table refunds add column invoice_id text references invoices(id);
create index usage_charges_uninvoiced on usage_charges (user_sub) where invoice_id is null;
create index refunds_uninvoiced on refunds (user_sub) where invoice_id is null;

-- Issue #40 (2): an instance stopped because its account's invoice was declined and stayed
-- unpaid past the grace period (never deleted); started again, and its row deleted, once the
-- account owes nothing declined. Only instances running when the grace ran out are stopped,
-- so one the customer had stopped stays stopped. The audit log keeps the history.
create table payment_stops (
  vm_id      text not null primary key references vms(id),
  user_sub   text not null references users(sub),
  invoice_id text not null references invoices(id),
  stopped_at timestamptz not null
);
create index payment_stops_user on payment_stops (user_sub);

-- Issue #40 (5): a booking paid through Checkout, with what a refund refunds (its payment
-- intent), and its refund: at most one, in full — by the booker cancelling before the window
-- opens, or by a superadmin with a reason.
create table booking_payments (
  prebooking_id  text not null primary key references prebookings(id),
  payment_intent text not null,
  amount_cents   integer not null,
  currency       text not null,
  paid_at        timestamptz not null
);
create table booking_refunds (
  prebooking_id    text not null primary key references prebookings(id),
  stripe_refund_id text not null,
  amount_cents     integer not null,
  currency         text not null,
  reason           text not null,
  refunded_by      text references users(sub),
  created_at       timestamptz not null
);
