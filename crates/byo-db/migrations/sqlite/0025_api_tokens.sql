-- (SQLite twin of postgres/0025_api_tokens.sql.) -- Issue #43 (1): API tokens. A person makes named tokens for scripts and the `byo` CLI, each
-- with one scope (what it reaches: read, instances, hosts, admin — docs/api-tokens.md) and an
-- expiry; only the SHA-256 of the secret is kept, as for every other token. A revoked token
-- keeps its row (so presenting it says "revoked", and the audit names stay readable); a live
-- name is unique per person, so a revoked token's name can be given again.
create table api_tokens (
  id             text not null primary key,
  user_sub       text not null references users(sub) on delete cascade,
  name           text not null,
  scope          text not null,
  token_hash     text not null,
  created_at     timestamptz not null,
  expires_at     timestamptz not null,
  revoked_at     timestamptz,
  last_used_at   timestamptz,
  last_used_from text,
  constraint api_tokens_token_hash_key unique (token_hash),
  constraint api_tokens_scope_known check (scope in ('read', 'instances', 'hosts', 'admin')),
  constraint api_tokens_expiry_after_creation check (expires_at > created_at)
);
create unique index api_tokens_live_name on api_tokens (user_sub, name) where revoked_at is null;

-- What a request made with an API token wrote to the audit log names the token it acted
-- through (its name when used); null for a session's and a job's.
alter table audit_log add column via_token text;
