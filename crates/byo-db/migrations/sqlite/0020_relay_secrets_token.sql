-- A relay's secrets leave its instance metadata (issue #36): the metadata carries a
-- single-use token, and the relay fetches its WireGuard key and TLS certificate with it at
-- its first boot. Only the token's SHA-256 is kept; the fetch spends it (sets it null) and
-- records when and from where, which the host's audit shows too.
alter table hosts add column relay_secrets_token_hash text;
alter table hosts add column relay_secrets_expires_at timestamptz;
alter table hosts add column relay_secrets_fetched_at timestamptz;
alter table hosts add column relay_secrets_fetched_from text;
create unique index hosts_relay_secrets_token on hosts (relay_secrets_token_hash)
  where relay_secrets_token_hash is not null;
