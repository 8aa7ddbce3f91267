//! The fleet at a glance (issue #38, 1): every host not retired, its state in one word, its
//! problems by the names its own page gives them (the one judge, `host_problems`), counted,
//! filtered, sorted and paged on the server. The read is five statements for the whole
//! fleet (`Store::fleet_read`), and [`overview`] is pure, with time passed in.

use std::collections::{BTreeMap, HashMap};

use byo_db::fleet::{FleetHostRow, FleetRead};
use byo_db::hosts::HostStatusRow;
use byo_db::operator_keys::{HostKeyPushRow, KeyListRow};
use byo_db::vms::VmRow;
use byo_wire::overview::{
    FleetCounts, FleetOverview, FleetProblem, FleetRow, FleetSort, FleetState, ProblemCount,
};
use chrono::{DateTime, Utc};

use crate::app::host_problems::{Problem, Seen, problems};
use crate::error::AppResult;
use crate::state::AppState;

/// Hosts per page.
pub const PAGE_SIZE: usize = 50;

/// What the operator asked to see.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetFilter {
    pub state: Option<FleetState>,
    /// A problem's name, as the host's page gives it ("agent unreachable", "stuck delete", …).
    pub problem: Option<String>,
    pub gpu_type: Option<String>,
    /// Part of the owner's email, any case.
    pub owner: Option<String>,
    pub sort: FleetSort,
    /// 1 is the first page; past the last, the last.
    pub page: u32,
}

/// One host as judged: its row, what it last reported, and its problems, each with when it
/// began where that is known (an unreachable agent's last heartbeat, a stuck delete's
/// request).
pub struct Judged<'a> {
    pub host: &'a FleetHostRow,
    pub status: Option<&'a HostStatusRow>,
    pub push: Option<&'a HostKeyPushRow>,
    pub problems: Vec<(Problem, Option<DateTime<Utc>>)>,
}

/// Every host of `read` with its problems now, in the read's order: the one judge
/// (`host_problems`) over the whole fleet, for the overview and the notices' sweep.
pub fn judged<'a>(
    read: &'a FleetRead,
    published: Option<&KeyListRow>,
    heard_since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Vec<Judged<'a>> {
    let statuses: HashMap<&str, _> = read
        .statuses
        .iter()
        .map(|s| (s.host_id.as_str(), s))
        .collect();
    let benches: HashMap<&str, _> = read
        .benches
        .iter()
        .map(|b| (b.host_id.as_str(), b))
        .collect();
    let pushes: HashMap<&str, _> = read
        .pushes
        .iter()
        .map(|p| (p.host_id.as_str(), p))
        .collect();
    let mut stuck: HashMap<&str, Vec<VmRow>> = HashMap::new();
    for v in &read.stuck {
        if let Some(h) = &v.host_id {
            stuck.entry(h.as_str()).or_default().push(v.clone());
        }
    }
    let no_vms: Vec<VmRow> = Vec::new();
    let published_expires = crate::app::host_problems::list_expiry(published);
    read.hosts
        .iter()
        .map(|h| {
            let id = h.host.id.as_str();
            let status = statuses.get(id).copied();
            let vms = stuck.get(id).unwrap_or(&no_vms);
            let found = problems(
                &Seen {
                    host: &h.host,
                    status,
                    heard_since,
                    push: pushes.get(id).copied(),
                    published,
                    published_expires,
                    vms,
                    bench: benches.get(id).copied(),
                },
                now,
            );
            let since = |name: &str| -> Option<DateTime<Utc>> {
                match name {
                    "agent unreachable" => Some(
                        status.map_or(h.host.prepared_at.unwrap_or(h.host.created_at), |s| {
                            s.seen_at
                        }),
                    ),
                    "stuck delete" => vms.iter().filter_map(|v| v.delete_requested_at).min(),
                    _ => None,
                }
            };
            Judged {
                host: h,
                status,
                push: pushes.get(id).copied(),
                problems: found
                    .into_iter()
                    .map(|p| {
                        let at = since(p.name);
                        (p, at)
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The overview of what was read, as of `now`; `heard_since` is the placement bound (an
/// agent not heard from since is unreachable).
pub fn overview(
    read: &FleetRead,
    published: Option<&KeyListRow>,
    heard_since: DateTime<Utc>,
    now: DateTime<Utc>,
    filter: &FleetFilter,
) -> FleetOverview {
    let mut counts = FleetCounts::default();
    let mut names: BTreeMap<String, i64> = BTreeMap::new();
    let mut gpu_types: Vec<String> = Vec::new();
    let owner = filter.owner.as_ref().map(|o| o.trim().to_lowercase());
    let mut rows: Vec<(Option<DateTime<Utc>>, FleetRow)> = Vec::new();
    for Judged {
        host: h,
        status,
        push,
        problems: found,
    } in judged(read, published, heard_since, now)
    {
        let unreachable = found.iter().any(|(p, _)| p.name == "agent unreachable");
        let state = if h.host.pubkey.is_none() {
            FleetState::Enrolling
        } else if h.host.prepared_at.is_none() {
            FleetState::Preparing
        } else if unreachable {
            FleetState::Unreachable
        } else if !h.host.active {
            FleetState::Depooled
        } else if h.live_instances > 0 {
            FleetState::Renting
        } else {
            FleetState::Idle
        };
        counts.total += 1;
        *match state {
            FleetState::Enrolling => &mut counts.enrolling,
            FleetState::Preparing => &mut counts.preparing,
            FleetState::Unreachable => &mut counts.unreachable,
            FleetState::Depooled => &mut counts.depooled,
            FleetState::Renting => &mut counts.renting,
            FleetState::Idle => &mut counts.idle,
        } += 1;
        if !found.is_empty() {
            counts.with_problem += 1;
        }
        let mut seen_names: Vec<&str> = Vec::new();
        for (p, _) in &found {
            if !seen_names.contains(&p.name) {
                seen_names.push(p.name);
                *names.entry(p.name.to_owned()).or_default() += 1;
            }
        }
        if !gpu_types.contains(&h.host.gpu_type) {
            gpu_types.push(h.host.gpu_type.clone());
        }
        let matches = filter.state.is_none_or(|s| s == state)
            && filter
                .problem
                .as_deref()
                .is_none_or(|want| found.iter().any(|(p, _)| p.name == want))
            && filter
                .gpu_type
                .as_deref()
                .is_none_or(|g| g == h.host.gpu_type)
            && owner
                .as_deref()
                .is_none_or(|o| h.owner_email.to_lowercase().contains(o));
        if !matches {
            continue;
        }
        let listed: Vec<FleetProblem> = found
            .into_iter()
            .map(|(p, since)| FleetProblem {
                name: p.name.to_owned(),
                detail: p.detail,
                since,
            })
            .collect();
        // A problem whose start is not known sorts as if it began now: after every dated one.
        let oldest = listed.iter().map(|p| p.since.unwrap_or(now)).min();
        rows.push((
            oldest,
            FleetRow {
                host_id: h.host.id.clone(),
                slug: h.host.slug.clone(),
                gpu_type: h.host.gpu_type.clone(),
                owner_email: h.owner_email.clone(),
                state,
                problems: listed,
                heartbeat_at: status.map(|s| s.seen_at),
                agent_version: status.and_then(|s| s.agent_version.clone()),
                key_list_version: push.and_then(|p| p.version),
                instances: h.live_instances,
            },
        ));
    }
    match filter.sort {
        FleetSort::Problems => rows.sort_by(|(a, x), (b, y)| {
            // With a problem first (None last), oldest first, then more problems, then name.
            (a.is_none(), a, std::cmp::Reverse(x.problems.len()), &x.slug).cmp(&(
                b.is_none(),
                b,
                std::cmp::Reverse(y.problems.len()),
                &y.slug,
            ))
        }),
        FleetSort::Heartbeat => rows.sort_by(|(_, x), (_, y)| {
            (x.heartbeat_at.is_some(), x.heartbeat_at, &x.slug).cmp(&(
                y.heartbeat_at.is_some(),
                y.heartbeat_at,
                &y.slug,
            ))
        }),
        // The read is by slug already.
        FleetSort::Slug => {}
    }
    let matching = rows.len();
    let pages = matching.div_ceil(PAGE_SIZE).max(1);
    let page = (filter.page.max(1) as usize).min(pages);
    let hosts = rows
        .into_iter()
        .skip((page - 1) * PAGE_SIZE)
        .take(PAGE_SIZE)
        .map(|(_, r)| r)
        .collect();
    gpu_types.sort();
    FleetOverview {
        counts,
        matching: i64::try_from(matching).unwrap_or(i64::MAX),
        page: u32::try_from(page).unwrap_or(u32::MAX),
        pages: u32::try_from(pages).unwrap_or(u32::MAX),
        hosts,
        problems: names
            .into_iter()
            .map(|(name, hosts)| ProblemCount { name, hosts })
            .collect(),
        gpu_types,
    }
}

/// `/admin` and `GET /api/admin/fleet`: read the fleet once and judge it.
pub async fn fleet_overview(state: &AppState, filter: &FleetFilter) -> AppResult<FleetOverview> {
    let now = state.clock.now();
    let (read, published) =
        tokio::try_join!(state.store.fleet_read(), state.store.published_key_list())?;
    Ok(overview(
        &read,
        published.as_ref(),
        state.config.placement.seen_since(now),
        now,
        filter,
    ))
}

/// The overview's query as the API and the page take it, every field optional text.
#[derive(Clone, Debug, Default, serde::Deserialize, utoipa::IntoParams)]
pub struct FleetQuery {
    /// One of renting, idle, preparing, enrolling, depooled, unreachable.
    pub state: Option<String>,
    /// A problem's name, as the host's page gives it (e.g. "agent unreachable").
    pub problem: Option<String>,
    pub gpu_type: Option<String>,
    /// Part of the owner's email.
    pub owner: Option<String>,
    /// problems (the default: the oldest problem first), heartbeat (the oldest first), slug.
    pub sort: Option<String>,
    /// 1 is the first page (50 hosts a page).
    pub page: Option<u32>,
}

impl FleetQuery {
    /// The filter it asks for; an unknown state or sort is refused by name. Empty fields
    /// (a form's blank choice) are no filter.
    pub fn filter(&self) -> AppResult<FleetFilter> {
        fn given(v: &Option<String>) -> Option<&str> {
            v.as_deref().map(str::trim).filter(|v| !v.is_empty())
        }
        for (name, v) in [
            ("problem", &self.problem),
            ("gpu_type", &self.gpu_type),
            ("owner", &self.owner),
        ] {
            if let Some(v) = given(v) {
                byo_wire::limits::text(name, v, byo_wire::limits::SHORT)
                    .map_err(crate::error::AppError::out_of_bounds)?;
            }
        }
        let state = match given(&self.state) {
            None => None,
            Some(s) => Some(s.parse::<FleetState>().map_err(|_| {
                crate::error::AppError::bad_request(
                    "invalid_state",
                    "state is one of renting, idle, preparing, enrolling, depooled, unreachable",
                )
            })?),
        };
        let sort = match given(&self.sort) {
            None | Some("problems") => FleetSort::Problems,
            Some("heartbeat") => FleetSort::Heartbeat,
            Some("slug") => FleetSort::Slug,
            Some(_) => {
                return Err(crate::error::AppError::bad_request(
                    "invalid_sort",
                    "sort is one of problems, heartbeat, slug",
                ));
            }
        };
        Ok(FleetFilter {
            state,
            problem: given(&self.problem).map(str::to_owned),
            gpu_type: given(&self.gpu_type).map(str::to_owned),
            owner: given(&self.owner).map(str::to_owned),
            sort,
            page: self.page.unwrap_or(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use byo_db::Json;
    use byo_db::fleet::FleetHostRow;
    use byo_db::hosts::{HostRow, HostStatusRow};
    use byo_wire::states::VmStatus;
    use chrono::TimeDelta;

    use super::*;

    fn at(minutes: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + TimeDelta::days(20_000) + TimeDelta::minutes(minutes)
    }

    /// Host `i`: `spark-NNN`, enrolled and prepared, active, owned by owner-<i % 3>.
    fn host(i: usize) -> FleetHostRow {
        FleetHostRow {
            host: HostRow {
                id: format!("h{i:03}"),
                slug: format!("spark-{i:03}"),
                owner_sub: format!("owner-{}", i % 3),
                profile_id: "gb10".into(),
                gpu_type: if i.is_multiple_of(2) {
                    "spark-1"
                } else {
                    "spark-2"
                }
                .into(),
                active: true,
                dedicated: false,
                dedicated_to: None,
                placement: None,
                prepare_state: None,
                prepared_at: Some(at(0)),
                pubkey: Some("wg".into()),
                lockout_owner: true,
                relay_name: None,
                relay_ip: None,
                created_at: at(0),
                activated_at: Some(at(0)),
                retired_at: None,
            },
            owner_email: format!("Owner{}@Example.com", i % 3),
            live_instances: 0,
        }
    }

    fn beat(i: usize, minute: i64) -> HostStatusRow {
        HostStatusRow {
            host_id: format!("h{i:03}"),
            seen_at: at(minute),
            agent_version: Some("0.7.3".into()),
            lxd: None,
            relay: None,
            tunnel: None,
            gpu: None,
            storage: None,
            instances: None,
            details: Json(Default::default()),
        }
    }

    fn stuck(i: usize, minute: i64) -> VmRow {
        VmRow {
            id: format!("v{i}"),
            user_sub: "customer".into(),
            host_id: Some(format!("h{i:03}")),
            name: format!("vm-{i}"),
            gpu_type: "spark-1".into(),
            ssh_hostname: None,
            ssh_port: None,
            status: VmStatus::Running,
            created_at: at(0),
            creation_failed_at: None,
            delete_requested_at: Some(at(minute)),
            deleted_at: None,
        }
    }

    /// Six hosts, one in each state: 0 renting, 1 idle, 2 preparing, 3 enrolling,
    /// 4 de-pooled, 5 unreachable (last beat minute 3); 0 also holds a delete asked for
    /// at minute 1 and never confirmed. Every other host beat at minute 11.
    fn fleet() -> FleetRead {
        let mut hosts: Vec<FleetHostRow> = (0..6).map(host).collect();
        hosts[0].live_instances = 1;
        hosts[2].host.prepared_at = None;
        hosts[2].host.active = false;
        hosts[3].host.pubkey = None;
        hosts[3].host.prepared_at = None;
        hosts[3].host.active = false;
        hosts[4].host.active = false;
        let statuses = [0, 1, 2, 4]
            .into_iter()
            .map(|i| beat(i, 11))
            .chain([beat(5, 3)])
            .collect();
        FleetRead {
            hosts,
            statuses,
            benches: Vec::new(),
            stuck: vec![stuck(0, 1)],
            pushes: Vec::new(),
        }
    }

    fn view(read: &FleetRead, filter: &FleetFilter) -> FleetOverview {
        overview(read, None, at(10), at(12), filter)
    }

    fn slugs(o: &FleetOverview) -> Vec<&str> {
        o.hosts.iter().map(|h| h.slug.as_str()).collect()
    }

    #[test]
    fn each_host_stands_in_one_state_and_the_counts_add_up() {
        let o = view(&fleet(), &FleetFilter::default());
        let c = &o.counts;
        assert_eq!(
            (
                c.total,
                c.renting,
                c.idle,
                c.preparing,
                c.enrolling,
                c.depooled,
                c.unreachable
            ),
            (6, 1, 1, 1, 1, 1, 1)
        );
        assert_eq!(
            c.with_problem, 2,
            "the stuck delete and the unreachable agent"
        );
        let state = |slug: &str| o.hosts.iter().find(|h| h.slug == slug).unwrap().state;
        assert_eq!(state("spark-000"), FleetState::Renting);
        assert_eq!(state("spark-001"), FleetState::Idle);
        assert_eq!(state("spark-002"), FleetState::Preparing);
        assert_eq!(state("spark-003"), FleetState::Enrolling);
        assert_eq!(state("spark-004"), FleetState::Depooled);
        assert_eq!(state("spark-005"), FleetState::Unreachable);
        let names: Vec<(&str, i64)> = o
            .problems
            .iter()
            .map(|p| (p.name.as_str(), p.hosts))
            .collect();
        assert_eq!(names, [("agent unreachable", 1), ("stuck delete", 1)]);
    }

    #[test]
    fn the_oldest_problem_comes_first_with_its_since() {
        let o = view(&fleet(), &FleetFilter::default());
        // The stuck delete (minute 1) is older than the silence (since minute 3).
        assert_eq!(&slugs(&o)[..2], ["spark-000", "spark-005"]);
        assert_eq!(o.hosts[0].problems[0].name, "stuck delete");
        assert_eq!(o.hosts[0].problems[0].since, Some(at(1)));
        assert_eq!(o.hosts[1].problems[0].since, Some(at(3)));
        assert!(o.hosts[2..].iter().all(|h| h.problems.is_empty()));
        // By heartbeat: never heard from first, then the oldest.
        let by_beat = view(
            &fleet(),
            &FleetFilter {
                sort: FleetSort::Heartbeat,
                ..FleetFilter::default()
            },
        );
        assert_eq!(&slugs(&by_beat)[..2], ["spark-003", "spark-005"]);
    }

    #[test]
    fn filters_narrow_the_rows_and_never_the_counts() {
        let read = fleet();
        let only = |f: FleetFilter| {
            let o = view(&read, &f);
            assert_eq!(o.counts.total, 6, "counts are the fleet's");
            slugs(&o).into_iter().map(str::to_owned).collect::<Vec<_>>()
        };
        assert_eq!(
            only(FleetFilter {
                problem: Some("agent unreachable".into()),
                ..FleetFilter::default()
            }),
            ["spark-005"]
        );
        assert_eq!(
            only(FleetFilter {
                state: Some(FleetState::Depooled),
                ..FleetFilter::default()
            }),
            ["spark-004"]
        );
        assert_eq!(
            only(FleetFilter {
                gpu_type: Some("spark-2".into()),
                sort: FleetSort::Slug,
                ..FleetFilter::default()
            }),
            ["spark-001", "spark-003", "spark-005"]
        );
        // Part of the owner's email, any case.
        assert_eq!(
            only(FleetFilter {
                owner: Some("OWNER1@".into()),
                sort: FleetSort::Slug,
                ..FleetFilter::default()
            }),
            ["spark-001", "spark-004"]
        );
    }

    #[test]
    fn pages_of_fifty_and_a_page_past_the_end_is_the_last() {
        let read = FleetRead {
            hosts: (0..120).map(host).collect(),
            statuses: (0..120).map(|i| beat(i, 11)).collect(),
            ..FleetRead::default()
        };
        let page = |n| {
            view(
                &read,
                &FleetFilter {
                    page: n,
                    sort: FleetSort::Slug,
                    ..FleetFilter::default()
                },
            )
        };
        let first = page(1);
        assert_eq!(
            (first.matching, first.pages, first.hosts.len()),
            (120, 3, 50)
        );
        assert_eq!(first.hosts[0].slug, "spark-000");
        let last = page(3);
        assert_eq!((last.page, last.hosts.len()), (3, 20));
        assert_eq!(last.hosts[19].slug, "spark-119");
        assert_eq!(page(99).page, 3);
        assert_eq!(page(0).page, 1);
    }

    #[test]
    fn a_query_names_what_it_refuses() {
        let bad = FleetQuery {
            state: Some("sleeping".into()),
            ..FleetQuery::default()
        };
        assert_eq!(bad.filter().unwrap_err().code(), "invalid_state");
        let bad = FleetQuery {
            sort: Some("random".into()),
            ..FleetQuery::default()
        };
        assert_eq!(bad.filter().unwrap_err().code(), "invalid_sort");
        // A form's blank choices are no filter.
        let blank = FleetQuery {
            state: Some(String::new()),
            problem: Some(" ".into()),
            ..FleetQuery::default()
        };
        assert_eq!(
            blank.filter().unwrap(),
            FleetFilter {
                page: 1,
                ..FleetFilter::default()
            }
        );
    }
}
