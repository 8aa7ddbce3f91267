-- (SQLite twin of postgres/0027_signup_confirmations.sql.)
-- Issue #36 (8): an address is confirmed by mail before an account is made with it. A
-- sign-up writes one row here and mails its token (only the SHA-256 is kept); the account
-- exists only once the mailbox's reader follows the link and gives the password chosen at
-- sign-up, so nobody can make an account with someone else's address, and a sign-up with
-- an address that already has an account writes nothing. The password's argon2 hash waits
-- here, never the password. Rows past `expires_at` are refused and purged by the reap job;
-- confirming deletes every row of that address.
create table signup_confirmations (
  token_hash    text not null primary key,
  email         text not null,
  display_name  text not null,
  password_hash text not null,
  created_at    timestamptz not null,
  expires_at    timestamptz not null,
  constraint signup_confirmations_expiry_after_creation check (expires_at > created_at)
);
create index signup_confirmations_email on signup_confirmations (email);
create index signup_confirmations_expiry on signup_confirmations (expires_at);
