-- The installation's relay CA (issue #11): it signs each relay's TLS certificate at
-- relay-provision, and the backend trusts only it when calling an agent through a relay.
-- One row; the private key sealed with the server key, never stored in plaintext.
create table relay_ca (
  id          integer not null primary key,
  cert_pem    text not null,
  sealed_key  text not null,
  created_at  timestamptz not null,
  constraint relay_ca_one_row check (id = 1)
);
