-- The placement pick walks a kind's hosts in its own order (the dedicated first, then by
-- activation) and stops once it has the candidates it asked for (issue #41, 4: the drain
-- picks once per batch): without this index every pick read and sorted the whole fleet.
create index hosts_pick_order on hosts (gpu_type, dedicated desc, activated_at, slug)
  where active and retired_at is null;
