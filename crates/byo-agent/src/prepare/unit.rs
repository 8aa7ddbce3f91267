//! What enverge-agent-prepare runs, as root (`byo-agent prepare`): enrol with the token the
//! installer left (once), build the plan from the kept credentials, run the steps on node0
//! (and through it the satellites), print and report progress, and hand over to serving.
//! A completed preparation is recorded, and later starts find the record and exit at once
//! (L, rule 1). A failed one exits non-zero and the unit runs it again on its own
//! (`byo_core::render::units::PREPARE_RETRY_SECS`); every attempt first asks the backend
//! for the published operator-key list.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

use anyhow::Context;
use byo_core::prepare::{Mode, Progress};
use byo_wire::enroll::{EnrollResponse, HostRelay};
use byo_wire::prepare::HostReport;

use super::again::{self, AgainError};
use super::{HandOver, build_id, hand_over, handed_over, peers, plan_from};
use crate::enroll::{EnrollError, EnrollOutcome, EnrollPaths, Enroller, enroll_this_machine};
use crate::host::LocalHost;
use crate::operator_keys::OperatorKeys;
use crate::report::Reporter;

/// Keep the operator-key list the backend publishes now, if it verifies as a push would.
/// Serving receives pushes, and serving does not run until preparation completes: without
/// this, a host whose enrolment list was missing or expired would wait for a person. A
/// refusal or an unreachable backend is said, and preparation goes on with what it holds.
fn refresh_operator_keys(keys: &OperatorKeys, reporter: &Reporter) {
    match reporter.published_operator_keys() {
        Ok(None) => println!("no operator-key list is published yet"),
        Ok(Some(bytes)) => match keys.keep(&bytes, chrono::Utc::now()) {
            Ok(kept) => println!(
                "operator-key list version {} ({} keys) is the published one; kept",
                kept.version, kept.keys
            ),
            Err(e) => eprintln!(
                "byo-agent: the published operator-key list was not kept ({e}); preparing with the list this host holds"
            ),
        },
        Err(e) => eprintln!(
            "byo-agent: could not fetch the published operator-key list ({e}); preparing with the list this host holds"
        ),
    }
}

/// Which run this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum How {
    /// The unit's: once, until the hand-over; later starts exit at once (rule 1).
    Unit,
    /// Checks only: what each step would change, nothing changed.
    DryRun,
    /// The deliberate run (L): an operator's, on an idle host that completed preparation,
    /// every step checked again ([`super::again`]).
    Again,
}

/// Prepare the host whose filesystem is at `root` (`/` on a host). `dry_run` only checks,
/// and prints what each step would change.
pub fn run(root: &Path, dry_run: bool) -> anyhow::Result<()> {
    prepare(root, if dry_run { How::DryRun } else { How::Unit })
}

/// `byo-agent prepare --again`: refused (with its reason, nothing changed) on a host that
/// has not completed preparation, while the VM API or another run holds the lock, or while
/// an instance holds the rails; otherwise C in full, a failure reported and left.
pub fn run_again(root: &Path) -> anyhow::Result<()> {
    prepare(root, How::Again)
}

/// `byo-agent firewall-refresh` (root's `enverge-tenant-firewall-refresh.service`, started
/// when serving asks): the tenant firewall brought to what the host is now — its networks
/// and the owner's public address — by the firewall step's own render, check and load, on a
/// host whose preparation completed. Nothing else is read from serving but that address.
pub fn refresh_firewall(root: &Path) -> anyhow::Result<()> {
    let mut host = LocalHost {
        root: root.to_path_buf(),
        ..Default::default()
    };
    if !handed_over(&mut host).map_err(anyhow::Error::msg)? {
        println!("preparation has not completed; its firewall step loads the table");
        return Ok(());
    }
    let enroller = Enroller::new(
        "",
        EnrollPaths {
            root: root.to_path_buf(),
        },
    );
    let creds = enroller
        .kept()?
        .context("no credentials were kept by enrolment")?;
    let plan = plan_from(&creds, None).map_err(anyhow::Error::msg)?;
    if super::refresh_tenant_firewall(&mut host, &plan).map_err(anyhow::Error::msg)? {
        println!("the tenant firewall was reloaded for what this host is now");
    } else {
        println!("the tenant firewall already holds what this host is now");
    }
    Ok(())
}

fn prepare(root: &Path, how: How) -> anyhow::Result<()> {
    let dry_run = how == How::DryRun;
    let mut host = LocalHost {
        root: root.to_path_buf(),
        ..Default::default()
    };
    let prepared = handed_over(&mut host).map_err(anyhow::Error::msg)?;
    if prepared && how == How::Unit {
        println!("preparation completed earlier; nothing to do");
        return Ok(());
    }
    // The deliberate run's refusals come before anything is read from the backend or
    // written here, and its lock is held to the end (a create cannot start mid-run).
    let _lock = if how == How::Again {
        if !prepared {
            return Err(AgainError::NotPrepared.into());
        }
        let lock = again::lock_exclusive(&root.join(again::PREPARE_LOCK.trim_start_matches('/')))?;
        let held = again::holding(&mut host)?;
        if !held.is_empty() {
            return Err(AgainError::Held(held).into());
        }
        Some(lock)
    } else {
        None
    };
    let etc = root.join("etc/enverge");
    let server = std::fs::read_to_string(etc.join("server"))
        .ok()
        .map(|s| s.trim().to_owned());
    let enroller = Enroller::new(
        server.as_deref().unwrap_or_default(),
        EnrollPaths {
            root: root.to_path_buf(),
        },
    );
    if enroller.kept()?.is_none() {
        server
            .as_deref()
            .context("reading /etc/enverge/server (run install.sh)")?;
        let token_file = etc.join("enrol-token");
        let token = std::fs::read_to_string(&token_file).unwrap_or_default();
        let outcome = enroll_this_machine(&enroller, &token)?;
        // A token is good for one answer: spent on success, worthless after a refusal.
        if matches!(
            outcome,
            Ok(EnrollOutcome::Enrolled { .. })
                | Err(EnrollError::InvalidToken(_) | EnrollError::Rejected(_))
        ) {
            let _ = std::fs::remove_file(&token_file);
        }
        let (EnrollOutcome::Enrolled { slug } | EnrollOutcome::AlreadyEnrolled { slug }) = outcome?;
        println!("enrolled as {slug}");
    }
    let creds = enroller
        .kept()?
        .context("no credentials were kept by enrolment")?;
    let creds = match &server {
        Some(s) if !dry_run => learn_relay_endpoint(&enroller, s, creds),
        _ => creds,
    };
    let mut keys = enroller.operator_keys(&creds.environment);
    keys.host = Some(creds.slug.clone());
    let reporter = match &server {
        Some(s) if !dry_run => {
            Some(Reporter::new(s, &creds.host_token).map_err(anyhow::Error::msg)?)
        }
        _ => None,
    };
    if let Some(r) = &reporter {
        refresh_operator_keys(&keys, r);
    }
    let authorized_keys = match keys.held()? {
        Some((_, list)) => Some(keys.authorized_keys(&list, chrono::Utc::now())?),
        None => None,
    };
    let mut plan = plan_from(&creds, authorized_keys).map_err(anyhow::Error::msg)?;
    let build = build_id();
    // node0's steps and the satellites' (run inside the satellites step) report alike.
    let reporter = Rc::new(RefCell::new(reporter));
    let emit = {
        let reporter = reporter.clone();
        move |p: &Progress| {
            let s = &p.state;
            match &s.error {
                Some(e) => println!("  node{} {:<16} {:?}: {e}", p.node, s.step, s.state),
                None => println!("  node{} {:<16} {:?}", p.node, s.step, s.state),
            }
            if let Some(r) = reporter.borrow_mut().as_mut() {
                r.send_or_log(&HostReport {
                    node: p.node,
                    state: p.state.clone(),
                    completed: false,
                });
            }
        }
    };
    let emit = Rc::new(emit);
    if plan.profile.node_count > 1 {
        let peers = std::fs::read_to_string(etc.join("peer.json"))
            .context("reading /etc/enverge/peer.json (the satellites found at enrolment)")?;
        plan.peers = peers::parse_peer_file(&peers).map_err(anyhow::Error::msg)?;
        // A dry run writes nothing: it reads the key if one was made.
        plan.peer_public_key = if dry_run {
            std::fs::read_to_string(etc.join(format!("{}.pub", peers::PEER_KEY))).ok()
        } else {
            Some(peers::ensure_peer_key(&etc).map_err(anyhow::Error::msg)?)
        };
        let sink = emit.clone();
        let rails_to = reporter.clone();
        plan.satellites = Some(Rc::new(peers::SshSatellites {
            dir: etc.clone(),
            lxd_socket: peers::lxd_socket(&plan).into(),
            report: Box::new(move |p| sink(&p)),
            report_rails: Box::new(move |rails| {
                let verified = if rails.verified { ", verified" } else { "" };
                println!(
                    "  node{} rails: {}{verified}",
                    rails.node,
                    rails
                        .ports
                        .iter()
                        .filter_map(|p| Some(format!("{} {}", p.iface, p.address.as_deref()?)))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                if let Some(r) = rails_to.borrow_mut().as_mut() {
                    r.send_rails_or_log(&rails);
                }
            }),
        }));
    }
    if how == How::Again {
        let held = again::satellites_holding(&plan);
        if !held.is_empty() {
            return Err(AgainError::Held(held).into());
        }
    }
    let mode = if dry_run { Mode::DryRun } else { Mode::Run };
    println!(
        "preparing {} as {build}{}",
        creds.slug,
        match how {
            How::DryRun => " (dry run: checks only)",
            How::Again =>
                " (again, deliberately: every step is checked, whatever the done list says; serving keeps running)",
            How::Unit => "",
        }
    );
    let mut last = None;
    let started = std::time::Instant::now();
    let outcome = super::run_trusting(
        &mut host,
        &plan,
        0,
        &build,
        mode,
        how != How::Again,
        chrono::Utc::now,
        |p| {
            emit(&p);
            last = Some(p);
        },
    );
    println!(
        "took {} ms, {} programs run",
        started.elapsed().as_millis(),
        host.spawned
    );
    if dry_run {
        if outcome.changes.is_empty() {
            println!("nothing would change: this host is prepared");
        } else {
            println!("would change:");
            for (step, what) in &outcome.changes {
                println!("  {step}: {what}");
            }
        }
        return Ok(());
    }
    if !outcome.changes.is_empty() {
        println!("changed:");
        for (step, what) in &outcome.changes {
            println!("  {step}: {what}");
        }
    }
    if let Some((step, error)) = outcome.failed {
        // Reported (the failed step went to host-report above) and left: nothing is
        // undone, and serving, which this run never touches, keeps running (L, rule 2).
        if how == How::Again {
            return Err(AgainError::Failed { step, error }.into());
        }
        anyhow::bail!("preparation stopped at {step}: {error}");
    }
    hand_over(
        &mut host,
        &HandOver {
            host_id: creds.host_id.clone(),
            slug: creds.slug.clone(),
            server: server.clone().unwrap_or_default(),
            host_token: creds.host_token.clone(),
            ssh_map_endpoint: creds.ssh_map_endpoint.clone(),
            ssh_map_token: creds.ssh_map_token.clone(),
            ssh_listen: creds
                .wireguard
                .address
                .split('/')
                .next()
                .unwrap_or("10.8.0.2")
                .to_owned(),
            gpu: plan.profile.gpu_count.unwrap_or(0) > 0,
            build,
            tunnel: Some(plan.tunnel_token.is_some()),
            rail_ports: if plan.peers.is_empty() {
                Vec::new()
            } else {
                crate::detect::rdma_ports(&crate::detect::LocalProbe)
                    .into_iter()
                    .map(|(iface, _)| iface)
                    .collect()
            },
            rail_neighbours: plan
                .peers
                .iter()
                .flat_map(|p| p.link_local.iter().map(move |a| (a.clone(), p.index)))
                .collect(),
            pair: peers::pair_nodes(&plan).map_err(anyhow::Error::msg)?,
        },
    )
    .map_err(anyhow::Error::msg)?;
    if let (Some(r), Some(p)) = (reporter.borrow_mut().as_mut(), last) {
        r.send_or_log(&HostReport {
            node: p.node,
            state: p.state,
            completed: true,
        });
    }
    match how {
        How::Again => println!(
            "prepared again: every step checked, {} changed; serving was not restarted",
            outcome.changes.len()
        ),
        _ => println!("prepared: the credentials are handed to serving"),
    }
    Ok(())
}

/// Ask the backend where the relay is now, and keep its endpoint in the credentials when
/// it differs from what they hold. A host that redeemed before its relay had an address was
/// given none, and relay-peer will not go on without one: this attempt, or a later one (a
/// failed preparation runs again on its own), picks it up once the relay has an address.
/// An answer that does not come is said, and preparation goes on with what it holds.
pub fn learn_relay_endpoint(
    enroller: &Enroller,
    server: &str,
    mut creds: EnrollResponse,
) -> EnrollResponse {
    let asked = Reporter::new(server, &creds.host_token).and_then(|r| r.relay());
    match asked {
        Ok(HostRelay {
            endpoint: Some(endpoint),
        }) if creds.wireguard.endpoint.as_deref() != Some(endpoint.as_str()) => {
            match enroller.keep_relay_endpoint(&endpoint) {
                Ok(()) => println!("the relay is at {endpoint}; kept"),
                Err(e) => eprintln!(
                    "byo-agent: the relay is at {endpoint}, but it could not be kept ({e}); using it for this attempt"
                ),
            }
            creds.wireguard.endpoint = Some(endpoint);
        }
        Ok(HostRelay { endpoint: None }) if creds.wireguard.endpoint.is_none() => {
            println!("the relay has no address yet");
        }
        Ok(_) => {}
        Err(e) => eprintln!(
            "byo-agent: could not ask where the relay is ({e}); preparing with what this host holds"
        ),
    }
    creds
}
