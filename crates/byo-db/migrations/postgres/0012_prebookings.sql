-- Pre-bookings (E3, issue #13). Why a booking closed (its window ended, or its booker
-- cancelled it unpaid), and why the launcher has not launched it yet — recorded on the
-- row at each tick so the booker and operators can read it (E3.2: an unavailable pin stays
-- open for the next tick and an operator to reassign; E3.5: no key leaves it open for an
-- operator to follow up).
alter table prebookings add column closed_reason text constraint prebookings_closed_reason_known check (closed_reason is null or (closed_at is not null and closed_reason in ('ended', 'cancelled')));
alter table prebookings add column launch_note text constraint prebookings_launch_note_bounded check (launch_note is null or length(launch_note) between 1 and 500);
alter table prebookings add column launch_note_at timestamptz;
-- The launcher's and expire-prebook's scans: open bookings by window.
create index prebookings_open_start on prebookings (start_date) where closed_at is null;
create index prebookings_open_end on prebookings (end_date) where closed_at is null;
create index prebookings_user_sub on prebookings (user_sub);
-- One live instance per booking: the launcher and an operator's launch (caller 5) racing
-- for one booking cannot both land, whatever host each picked (a legacy row's pool pick).
create unique index vms_one_live_per_prebooking on vms (prebooking_id)
  where prebooking_id is not null and deleted_at is null and creation_failed_at is null;
-- E3.2: a booking pins its host for its window, so a host is never pinned by two open
-- bookings whose windows overlap ([start, end) ranges). Writers of one host's bookings
-- are serialised on the host's row, so two racing bookings cannot both pass.
create function prebookings_host_not_double_booked() returns trigger language plpgsql as $$
begin
  if new.host_id is not null and new.closed_at is null then
    perform 1 from hosts where id = new.host_id for update;
    if exists (select 1 from prebookings b
               where b.host_id = new.host_id and b.id <> new.id and b.closed_at is null
                 and b.start_date < new.end_date and new.start_date < b.end_date) then
      raise exception 'prebookings_host_not_double_booked'
        using errcode = 'check_violation', constraint = 'prebookings_host_not_double_booked';
    end if;
  end if;
  return new;
end $$;
create trigger prebookings_host_not_double_booked before insert on prebookings
  for each row execute function prebookings_host_not_double_booked();
create trigger prebookings_host_not_double_booked_update
  before update of host_id, start_date, end_date, closed_at on prebookings
  for each row execute function prebookings_host_not_double_booked();
