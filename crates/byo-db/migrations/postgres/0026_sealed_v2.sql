-- Sealed values bound to their place (issue #36, 8): a `sealed:v2:` value names its table,
-- column and row in its associated data, so it opens only where it was sealed. The server
-- re-seals the `sealed:v1:` values it finds in place at its start, and writes this one row
-- once that pass has finished: from then on no `sealed:v1:` value is re-sealed, so one copied
-- in later (from an old dump) never opens.
create table sealed_v2 (
  id           integer not null primary key,
  resealed_at  timestamptz not null,
  constraint sealed_v2_one_row check (id = 1)
);
