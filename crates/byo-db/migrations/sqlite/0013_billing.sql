-- Issue #13 (4): billing on Stripe.
--
-- Each account's Stripe customer, made the first time the account asks to add a payment
-- method. Whether that customer may be charged is never stored here: it is asked of Stripe
-- live (E2), so only the id is kept.
create table stripe_customers (
  user_sub    text not null primary key references users(sub),
  customer_id text not null,
  created_at  timestamptz not null,
  constraint stripe_customers_customer_id_key unique (customer_id)
);

-- Every verified webhook event, by Stripe's event id: the row is the idempotency. A replay
-- finds processed_at set and changes nothing; an event whose processing failed (no
-- processed_at) is processed again when Stripe retries it.
create table stripe_events (
  event_id     text not null primary key,
  type         text not null,
  received_at  timestamptz not null,
  processed_at timestamptz
);

-- One invoice item per instance per billing period (a UTC day), from the four timestamps:
-- billable time is [created_at, deleted_at); creation_failed_at bills nothing. The key is
-- the Stripe Idempotency-Key, derived from (vm, period), so a retried job never charges
-- twice; the unique (vm_id, period_start) makes that a rule for every writer.
create table usage_charges (
  id                     text not null primary key,
  vm_id                  text not null references vms(id),
  user_sub               text not null references users(sub),
  period_start           timestamptz not null,
  period_end             timestamptz not null,
  seconds                integer not null,
  amount_cents           integer not null,
  currency               text not null,
  idempotency_key        text not null,
  stripe_invoice_item_id text,
  created_at             timestamptz not null,
  constraint usage_charges_one_per_vm_period unique (vm_id, period_start),
  constraint usage_charges_idempotency_key_key unique (idempotency_key),
  constraint usage_charges_period_ordered check (period_end > period_start),
  constraint usage_charges_not_negative check (seconds >= 0 and amount_cents >= 0)
);

-- The refund of a stuck delete (G.3): the time from delete_requested_at (the customer gave
-- the instance up when they asked) to deleted_at, when that exceeded the stuck threshold.
-- At most one per instance.
create table refunds (
  id               text not null primary key,
  vm_id            text not null references vms(id),
  user_sub         text not null references users(sub),
  from_at          timestamptz not null,
  to_at            timestamptz not null,
  seconds          integer not null,
  amount_cents     integer not null,
  currency         text not null,
  idempotency_key  text not null,
  stripe_credit_id text,
  created_at       timestamptz not null,
  constraint refunds_one_per_vm unique (vm_id),
  constraint refunds_idempotency_key_key unique (idempotency_key),
  constraint refunds_from_requested_to_deleted check (to_at > from_at),
  constraint refunds_not_negative check (seconds >= 0 and amount_cents >= 0)
);

-- An instance whose billing is finished: closed (deleted_at), every period charged and its
-- refund, if one was due, made. bill-usage reads only instances without one.
create table billing_closed (
  vm_id     text not null primary key references vms(id),
  closed_at timestamptz not null
);
