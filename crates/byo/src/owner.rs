//! An owner's commands (issue #43, 3): their machines in the words *Your GPUs* uses, adding
//! one (the one-liner), and stopping hosting — each a call to the public API with a token of
//! scope `hosts` (or `read`, to look only).

use byo_wire::billing::EarningsView;
use byo_wire::enroll::{OwnerHostView, ProvisionRequest, ProvisionResponse};
use byo_wire::lifecycle::HostProgress;
use clap::{Args, Subcommand};
use reqwest::Method;

use crate::api::{Api, ApiError};
use crate::print::{Output, details, print_with, table, when};

type Result<T> = std::result::Result<T, ApiError>;

#[derive(Subcommand)]
pub enum HostsCommand {
    /// Your GPUs, each with its state in your words (waiting for the command, preparing,
    /// idle, renting, unreachable, stopped…).
    ///
    /// Example: byo hosts list
    List(Output),
    /// One of your GPUs by its name (slug): its state, the step preparation is on and,
    /// when a step failed, what it means and who fixes it; with billing on, what it earned.
    ///
    /// Example: byo hosts show spark-7f3a
    Show(HostRef),
    /// Add a GPU: prints the one-liner to run once on the machine, within the hour.
    ///
    /// Example: byo hosts add --profile gb10-spark-1
    Add(AddArgs),
    /// Cancel a GPU you added and never ran the one-liner for: what was set aside for it (its
    /// relay, address, tunnel and names) is handed back.
    ///
    /// Example: byo hosts cancel spark-7f3a
    Cancel(HostRef),
    /// Stop hosting one of your GPUs: it takes no new rentals and what runs on it ends; run
    /// it again until it says you can uninstall.
    ///
    /// Example: byo hosts stop-hosting spark-7f3a
    StopHosting(HostRef),
}

#[derive(Args)]
pub struct HostRef {
    /// The GPU's name as `byo hosts list` prints it (its slug), or its host id.
    pub host: String,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args)]
pub struct AddArgs {
    /// What you are adding: gb10-spark-1, gb10-spark-2 (a cabled pair) or gb10-spark-4 (staff
    /// also linux-test, an ordinary Linux machine); an unknown one is answered with the list.
    #[arg(long)]
    pub profile: String,
    #[command(flatten)]
    pub output: Output,
}

pub async fn hosts(command: HostsCommand) -> Result<()> {
    let api = Api::from_saved()?;
    match command {
        HostsCommand::List(out) => {
            let mine: Vec<OwnerHostView> = api.get("/api/hosts").await?;
            print_with(out, &mine, || {
                table(
                    &["NAME", "PROFILE", "STATE", "ADDED"],
                    mine.iter()
                        .map(|h| {
                            vec![
                                h.slug.clone().unwrap_or_else(|| "—".into()),
                                h.profile_id.clone(),
                                h.state.clone(),
                                when(h.created_at),
                            ]
                        })
                        .collect(),
                    "No GPUs yet: byo hosts add --profile gb10-spark-1",
                )
            });
        }
        HostsCommand::Show(r) => {
            let host = find_host(&api, &r.host).await?;
            let earnings: EarningsView = api.get("/api/me/earnings").await?;
            let slug = host.slug.clone().unwrap_or_default();
            let months: Vec<_> = earnings
                .months
                .iter()
                .filter(|m| m.host_slug == slug)
                .collect();
            if r.output.json {
                print_with(r.output, &host, String::new);
                return Ok(());
            }
            let mut lines = vec![
                ("name", slug.clone()),
                ("profile", host.profile_id.clone()),
                ("state", host.state.clone()),
            ];
            if let Some(step) = &host.last_step {
                lines.push(("last step", step.clone()));
            }
            if let Some(advice) = &host.advice {
                lines.push(("what it means", advice.clone()));
            }
            if let Some(at) = host.prepared_at {
                lines.push(("prepared", when(at)));
            }
            if host.nodes > 1 {
                lines.push(("machines", host.nodes.to_string()));
            }
            lines.push(("added", when(host.created_at)));
            if let Some(id) = &host.host_id {
                lines.push(("id", id.clone()));
            }
            for m in months {
                lines.push((
                    "earned",
                    format!(
                        "{}: {} {} of {} invoiced ({} h)",
                        m.month,
                        cents(m.owner_cents),
                        earnings.currency.to_uppercase(),
                        cents(m.amount_cents),
                        m.seconds / 3600
                    ),
                ));
            }
            print!("{}", details(lines));
        }
        HostsCommand::Add(a) => {
            let (_, p): (_, ProvisionResponse) = api
                .send(
                    Method::POST,
                    "/api/hosts",
                    Some(&ProvisionRequest {
                        profile_id: a.profile.clone(),
                    }),
                )
                .await?;
            print_with(a.output, &p, || {
                format!(
                    "Everything for {} is ready. Run this once on the machine itself, as a user \
                     who can sudo, before {} (it works once):\n\n  {}\n\n`byo hosts show {}` \
                     follows its preparation.\n",
                    p.slug,
                    when(p.expires_at),
                    p.command,
                    p.slug
                )
            });
        }
        HostsCommand::Cancel(r) => {
            let host = find_host(&api, &r.host).await?;
            let id = match (&host.host_id, host.may_cancel) {
                (Some(id), true) => id.clone(),
                _ => {
                    return Err(ApiError::Local(format!(
                        "{} cannot be cancelled: it is {} (cancel is for a GPU that never ran \
                         its one-liner; stop hosting is for one that did)",
                        r.host, host.state
                    )));
                }
            };
            let status = api
                .send_empty(Method::POST, &format!("/api/hosts/{id}/cancel"))
                .await?;
            if status == reqwest::StatusCode::ACCEPTED {
                println!(
                    "Cancelled {}; part of what was set aside is still being handed back, which \
                     finishes on its own within minutes.",
                    r.host
                );
            } else {
                println!(
                    "Cancelled {}; everything set aside for it is handed back.",
                    r.host
                );
            }
        }
        HostsCommand::StopHosting(r) => {
            let host = find_host(&api, &r.host).await?;
            let id = host.host_id.clone().ok_or_else(|| {
                ApiError::Local(format!("{} is not hosting: {}", r.host, host.state))
            })?;
            let (_, p): (_, HostProgress) = api
                .send(Method::POST, &format!("/api/hosts/{id}/stop"), None::<&()>)
                .await?;
            print_with(r.output, &p, || format!("{}\n", p.message));
        }
    }
    Ok(())
}

fn cents(c: i64) -> String {
    format!("{}.{:02}", c / 100, (c % 100).abs())
}

/// One of the caller's GPUs by slug or host id.
async fn find_host(api: &Api, reference: &str) -> Result<OwnerHostView> {
    let mine: Vec<OwnerHostView> = api.get("/api/hosts").await?;
    mine.into_iter()
        .find(|h| h.slug.as_deref() == Some(reference) || h.host_id.as_deref() == Some(reference))
        .ok_or_else(|| {
            ApiError::Local(format!(
                "none of your GPUs is named {reference:?}: `byo hosts list` shows them"
            ))
        })
}
