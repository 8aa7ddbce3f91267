-- The tunnel's connector token, sealed with the server key: returned to the agent at
-- redeem (step 29), never stored in plaintext.
alter table hosts add column tunnel_token text;
