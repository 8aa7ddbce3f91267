-- (SQLite twin of postgres/0022_notices.sql.) Issue #38 (3): notices that reach people. One outbox: each row is one notice to one person,
-- raised by the code that saw the event (a queued create placed, a booking launched) or by
-- the notices job's sweep of conditions (a host unreachable, a stuck delete). `condition`
-- names what it is about; one open row per (condition, person) makes "each notice sent once":
-- a sweep that sees the condition again finds the open row and raises nothing. When the
-- condition goes away the row is stamped `cleared_at`, so the next time it comes back it is
-- a new notice. Delivery is per channel (`email_sent_at`, `webhook_sent_at`): a channel that
-- took the notice is never sent it again when another channel is retried.
create table notices (
  id              text not null primary key,
  kind            text not null,
  condition       text not null,
  recipient_sub   text not null references users(sub) on delete cascade,
  email           text not null,
  subject         text not null,
  body            text not null,
  created_at      timestamptz not null,
  cleared_at      timestamptz,
  attempts        integer not null default 0,
  next_attempt_at timestamptz,
  email_sent_at   timestamptz,
  webhook_sent_at timestamptz,
  given_up_at     timestamptz,
  last_error      text,
  constraint notices_attempts_nonneg check (attempts >= 0)
);
create unique index notices_open_condition on notices (condition, recipient_sub) where cleared_at is null;
-- The delivery job's read: rows with something left to send, soonest first.
create index notices_due on notices (next_attempt_at) where next_attempt_at is not null;
-- The outbox page, newest first.
create index notices_created on notices (created_at);

-- The notices a person turned off, by kind. A notice of a kind its recipient turned off is
-- never raised.
create table notice_opt_outs (
  user_sub   text not null references users(sub) on delete cascade,
  kind       text not null,
  created_at timestamptz not null,
  primary key (user_sub, kind)
);
