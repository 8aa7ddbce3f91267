-- Issue #20. Slugs are never reused, retired hosts included (N.3): reap deletes the hosts
-- row of a rejected, revoked or lapsed allocation, so the next slug cannot be read off the
-- hosts that remain. One row keeps the highest spark-N ever handed out; host-provision
-- takes the next number from it inside its locked transaction.
create table slug_high_water (
  id    integer not null primary key,
  last  integer not null,
  constraint slug_high_water_one_row check (id = 1)
);
insert into slug_high_water (id, last)
  select 1, coalesce(max(cast(substr(slug, 7) as integer)), 0)
  from hosts where slug ~ '^spark-[0-9]+$';

-- D: a placement is one of the design's closed set, shared or dedicated, for every writer.
update hosts set placement = 'shared' where placement is not null and placement not in ('shared', 'dedicated');
create function hosts_placement_closed_set() returns trigger language plpgsql as $$
begin
  if new.placement is not null and new.placement not in ('shared', 'dedicated') then
    raise exception 'hosts_placement_closed_set'
      using errcode = 'check_violation', constraint = 'hosts_placement_closed_set';
  end if;
  return new;
end $$;
create trigger hosts_placement_closed_set before update of placement on hosts
  for each row execute function hosts_placement_closed_set();
create trigger hosts_placement_closed_set_insert before insert on hosts
  for each row execute function hosts_placement_closed_set();
