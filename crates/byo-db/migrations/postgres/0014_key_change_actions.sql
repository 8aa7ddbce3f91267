-- Issue #16: a departure (every key of an operator whose role was revoked) and a signing-key
-- rotation (M.13) are changes to the draft too, recorded beside adds and removes.
alter table operator_key_changes drop constraint operator_key_changes_action_known;
alter table operator_key_changes add constraint operator_key_changes_action_known
  check (action in ('add', 'remove', 'depart', 'rotate', 'renew'));
