//! An owner's machines as they read them (issue #43, 3): each GPU they added, its state in
//! their words — the very sentences *Your GPUs* shows, from onboarding (waiting for the
//! command, preparing with its latest step, waiting for approval) to after go-live (idle,
//! renting, unreachable, stopping, stopped, retired) — with what a failed step means and
//! who fixes it. The page and `GET /api/hosts` both read it from here.

use byo_db::provisioning::EnrollmentView;
use byo_wire::enroll::OwnerHostView;
use byo_wire::prepare::PrepareState;
use byo_wire::states::EnrollmentState;
use chrono::{DateTime, Utc};

use crate::app::host_lifecycle;
use crate::app::host_report::{Fixer, failure_advice};
use crate::auth::CurrentUser;
use crate::error::AppResult;
use crate::state::AppState;

/// What is known about one host's onboarding: its enrolment (if it came through "add a
/// GPU") and the host row's own record.
pub struct Onboarding<'a> {
    /// The enrolment's state; `None` for a host that has no enrolment.
    pub enrollment: Option<EnrollmentState>,
    pub token_expires_at: Option<DateTime<Utc>>,
    pub reject_reason: Option<&'a str>,
    pub prepared_at: Option<DateTime<Utc>>,
    pub prepare_state: Option<&'a PrepareState>,
    /// `None` once the hosts row is gone (released or rejected).
    pub active: Option<bool>,
}

impl<'a> Onboarding<'a> {
    pub fn of(e: &'a EnrollmentView) -> Self {
        Onboarding {
            enrollment: Some(e.state),
            token_expires_at: Some(e.token_expires_at),
            reject_reason: e.reject_reason.as_deref(),
            prepared_at: e.prepared_at,
            prepare_state: e.prepare_state.as_ref().map(|s| &s.0),
            active: e.active,
        }
    }

    /// The onboarding state in the owner's words.
    pub fn summary(&self) -> String {
        if self.active == Some(true) {
            return "active: renting to customers".into();
        }
        match (self.enrollment, self.prepared_at, self.prepare_state) {
            (Some(s), ..) if s.is_open() => match self.token_expires_at {
                Some(at) => format!(
                    "waiting for the command (expires {} UTC)",
                    at.format("%H:%M")
                ),
                None => "waiting for the command".into(),
            },
            (Some(EnrollmentState::Rejected), ..) => {
                format!("rejected: {}", self.reject_reason.unwrap_or(""))
            }
            (_, Some(_), _) if self.active.is_some() => {
                "prepared: waiting for an operator's approval".into()
            }
            (_, None, Some(p)) if self.active.is_some() => format!("preparing: {}", step_line(p)),
            (Some(EnrollmentState::Enrolled), ..) => "enrolled: preparing".into(),
            (None, ..) => "not enrolled".into(),
            (Some(other), ..) => other.to_string(),
        }
    }

    /// Nothing more will change on this row: polling can stop. A prepared host still
    /// waits for its activation, which the owner sees arrive.
    pub fn settled(&self, now: DateTime<Utc>) -> bool {
        self.active != Some(false)
            || self.enrollment.is_some_and(EnrollmentState::is_ended)
            || (self.enrollment.is_some_and(EnrollmentState::is_open)
                && self.token_expires_at.is_some_and(|at| at <= now))
    }
}

/// One prepare_state (`{step, state, attempt, error, final, at}`) as a line.
pub fn step_line(p: &PrepareState) -> String {
    format!(
        "{} {}{}",
        p.step,
        p.state.as_str(),
        p.error
            .as_deref()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default()
    )
}

/// Whether a prepare_state is a failed step.
pub fn step_failed(p: &PrepareState) -> bool {
    p.failed()
}

/// A failed step in plain words: what is wrong, the usual cause, who fixes it.
pub fn advice_text(step: &str) -> String {
    let advice = failure_advice(step);
    let mut text = advice.wrong.to_owned();
    if let Some(cause) = advice.cause {
        text.push(' ');
        text.push_str(cause);
    }
    match advice.fixer {
        Fixer::Owner(what) => {
            text.push_str(" What you can do: ");
            text.push_str(what);
        }
        Fixer::Us => text.push_str(" Nothing for you to do: we fix this on our side."),
        Fixer::ItsOwnLine => text.push_str(" Its own line says why."),
    }
    text
}

/// A host after go-live, as its owner reads it.
pub struct AfterGoLive {
    pub words: String,
    pub may_stop: bool,
    pub stopped: bool,
}

/// The owner's words for a host past onboarding; `None` while it is still onboarding.
pub async fn after_go_live(
    state: &AppState,
    host_id: &str,
    now: DateTime<Utc>,
) -> AppResult<Option<AfterGoLive>> {
    let Some(h) = state.store.host_lifecycle(host_id).await? else {
        return Ok(None);
    };
    let seen = state.store.host_status(host_id).await?.map(|s| s.seen_at);
    let live = state.store.live_vms_of_host(host_id).await?.len();
    Ok(
        host_lifecycle::owner_state(&h, seen, live, state.config.placement.seen_since(now)).map(
            |words| AfterGoLive {
                words,
                may_stop: h.retired_at.is_none()
                    && h.revoke_step.0.is_none()
                    && !host_lifecycle::owner_stopped(&h, live),
                stopped: host_lifecycle::owner_stopped(&h, live),
            },
        ),
    )
}

/// `GET /api/hosts`: every GPU the caller added, newest first, as *Your GPUs* words it.
pub async fn mine(state: &AppState, by: &CurrentUser) -> AppResult<Vec<OwnerHostView>> {
    let enrollments = state.store.enrollment_views(Some(&by.user.sub)).await?;
    let now = state.clock.now();
    let mut views = Vec::with_capacity(enrollments.len());
    for e in &enrollments {
        let after = match (&e.host_id, e.active) {
            (Some(id), Some(_)) => after_go_live(state, id, now).await?,
            _ => None,
        };
        let onboarding = Onboarding::of(e);
        // A step is news only while the machine is still being prepared.
        let step = e
            .prepare_state
            .as_ref()
            .map(|p| &p.0)
            .filter(|_| after.is_none() && e.active == Some(false));
        views.push(OwnerHostView {
            host_id: e.host_id.clone(),
            slug: e.slug.clone(),
            enrollment_id: e.id.clone(),
            profile_id: e.profile_id.clone(),
            enrollment_state: e.state,
            state: after
                .as_ref()
                .map_or_else(|| onboarding.summary(), |a| a.words.clone()),
            last_step: step.map(step_line),
            advice: step
                .filter(|p| step_failed(p))
                .map(|p| advice_text(&p.step)),
            prepared_at: e.prepared_at,
            nodes: e.node_count,
            may_stop: after.as_ref().is_some_and(|a| a.may_stop),
            may_cancel: e.host_id.is_some() && e.active.is_some() && e.state.is_open(),
            created_at: e.created_at,
        });
    }
    Ok(views)
}
