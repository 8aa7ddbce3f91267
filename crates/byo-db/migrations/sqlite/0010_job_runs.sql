-- Issue #13 (1): the background-job driver records each run of each job: when it started,
-- how long it took, its outcome and its summary or error (bounded by the driver). Only the
-- newest runs of each job are kept (the driver trims after each insert), so the table stays
-- small; the index serves both the trim and /admin/jobs' "newest first per job".
create table job_runs (
  id          text not null primary key,
  job         text not null,
  started_at  timestamptz not null,
  duration_ms integer not null,
  outcome     text not null,
  summary     text,
  error       text,
  constraint job_runs_outcome_closed_set check (outcome in ('ok', 'failed')),
  constraint job_runs_duration_not_negative check (duration_ms >= 0)
);
create index job_runs_job_started_at on job_runs (job, started_at);
