-- Issue #39 (5): break glass past the operator-key list's expiry logs in with a certificate
-- one of the list's signers issued. sshd names it in the login line (its ID and serial), and
-- the beat carries that beside the key's fingerprint, so an owner and an operator see a break-
-- glass login as one. Null for a login with a plain key; bounded like the other text columns.
alter table operator_logins add column certificate text
  constraint operator_logins_certificate_bounded
  check (certificate is null or length(certificate) between 1 and 200);
