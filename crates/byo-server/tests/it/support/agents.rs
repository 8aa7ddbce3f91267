//! The one fake of the hosts' agents (`HostAgents`): it records every call and answers each
//! kind of call from a script the test sets — a default, answers for one host, and answers
//! queued for the next calls. Tests that need the real agent code either drive it behind
//! this fake (`receive_keys_with`) or run the agent's own router (see operator_keys.rs).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use byo_db::Store;
use byo_db::hosts::AgentTargetRow;
use byo_db::vms::VmRow;
use byo_server::agents::{AgentError, Gone, HostAgents};
use byo_server::clock::Clock;
use byo_wire::vm::{Advisory, CreateVm, VmAction, VmCreated};
use chrono::{DateTime, TimeDelta, Utc};
use futures::future::BoxFuture;

/// The kinds of call the backend makes to an agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `push_operator_keys`
    PushKeys,
    /// `create_vm`
    Create,
    /// `delete_vm`
    Delete,
    /// `vm_action` (start, stop, reboot)
    Power,
    /// `reboot_host` (L4)
    Reboot,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::PushKeys => "push",
            Op::Create => "create",
            Op::Delete => "delete",
            Op::Power => "power",
            Op::Reboot => "reboot",
        }
    }
}

/// How the agent answers one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Success: the keys are taken (by `receive_keys_with`'s receiver if there is one), the
    /// container is created, the power change done. A delete of a container this fake
    /// created answers `Gone::Deleted`, of any other the agent's own 404 (`Gone::NotFound`).
    Ok,
    /// The agent's own 404: a delete is confirmed (`Gone::NotFound`); any other call is
    /// refused with 404 "not found".
    NotFound,
    /// The agent answered with an error: its status and its reason.
    Refused { status: u16, reason: String },
    /// A create refused with `host_occupied`: the host holds an instance already (the
    /// agent's reason names it).
    Occupied(String),
    /// No answer at all (no connection).
    Unreachable(String),
    /// A create answered 2xx with a body that does not parse: the container exists (E2:
    /// accepted, never a refusal); the backend learns nothing from the body.
    Unreadable,
    /// Never answers: the backend's own wait runs out.
    Hang,
}

impl Answer {
    pub fn refused(status: u16, reason: &str) -> Answer {
        Answer::Refused {
            status,
            reason: reason.to_owned(),
        }
    }
    pub fn unreachable(why: &str) -> Answer {
        Answer::Unreachable(why.to_owned())
    }
}

/// One call, as the agent saw it.
#[derive(Clone, Debug)]
pub struct Call {
    pub op: Op,
    pub host_id: String,
    /// The instance's name; empty for a key push.
    pub name: String,
    /// A create's request.
    pub create: Option<CreateVm>,
    /// A power change's action.
    pub action: Option<VmAction>,
    /// A key push's signed list, exactly as sent.
    pub envelope: Option<Vec<u8>>,
    /// The clock (the test's, with `with_clock`) when the host was contacted.
    pub at: DateTime<Utc>,
    /// The instance's row as the database held it at that moment (with `observing`).
    pub row: Option<VmRow>,
}

/// What to do with a delivered key list; `Err` is the reason shown to operators.
type KeyReceiver = Box<dyn Fn(&AgentTargetRow, &[u8]) -> Result<(), String> + Send + Sync>;

#[derive(Default)]
struct Script {
    /// Answered when nothing more specific is set; `None` means `Answer::Ok`.
    default: Option<Answer>,
    /// Answers for calls to one host.
    per_host: HashMap<String, Answer>,
    /// Answers for the next calls, first in first out, before everything else.
    queued: VecDeque<Answer>,
    /// Real time the host takes before answering (so concurrent calls overlap).
    delay: Duration,
    /// Test-clock time the host takes (with `with_clock`).
    takes: TimeDelta,
}

pub struct FakeAgents {
    clock: Option<Clock>,
    store: Option<Store>,
    scripts: Mutex<HashMap<Op, Script>>,
    calls: Mutex<Vec<Call>>,
    /// Woken at every recorded call, for tests that wait for a host to be contacted.
    called: tokio::sync::Notify,
    /// (host id, name) of the containers the hosts run.
    containers: Mutex<HashSet<(String, String)>>,
    gpu_check: Mutex<Advisory>,
    receiver: Mutex<Option<KeyReceiver>>,
}

impl Default for FakeAgents {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeAgents {
    /// Agents that answer every call `Answer::Ok`.
    pub fn new() -> Self {
        FakeAgents {
            clock: None,
            store: None,
            scripts: Mutex::new(HashMap::new()),
            calls: Mutex::new(Vec::new()),
            called: tokio::sync::Notify::new(),
            containers: Mutex::new(HashSet::new()),
            gpu_check: Mutex::new(Advisory {
                ok: true,
                detail: None,
            }),
            receiver: Mutex::new(None),
        }
    }

    /// Stamp calls with this clock, and let `takes` move it.
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Record with each VM call the instance's row as it was when the host was contacted.
    pub fn observing(mut self, store: Store) -> Self {
        self.store = Some(store);
        self
    }

    /// Answer every call of this kind so (unless a host's or a queued answer applies).
    pub fn answer(&self, op: Op, answer: Answer) {
        self.script(op, |s| s.default = Some(answer));
    }

    /// Answer this kind of call to this host so; `None` returns it to the default.
    pub fn answer_on(&self, host_id: &str, op: Op, answer: Option<Answer>) {
        self.script(op, |s| match answer {
            Some(a) => s.per_host.insert(host_id.to_owned(), a),
            None => s.per_host.remove(host_id),
        });
    }

    /// Answer the next call of this kind so (queued answers are used in order).
    pub fn then(&self, op: Op, answer: Answer) {
        self.script(op, |s| s.queued.push_back(answer));
    }

    /// The host takes this long (really) before answering this kind of call.
    pub fn delay(&self, op: Op, by: Duration) {
        self.script(op, |s| s.delay = by);
    }

    /// The test clock moves this much while the host works on this kind of call.
    pub fn takes(&self, op: Op, by: TimeDelta) {
        assert!(self.clock.is_some(), "takes needs with_clock");
        self.script(op, |s| s.takes = by);
    }

    /// The GPU check a successful create reports.
    pub fn gpu_check(&self, advisory: Advisory) {
        *self.gpu_check.lock().unwrap() = advisory;
    }

    /// Hand key lists that are answered `Ok` to `receive` (e.g. the real agent's code),
    /// whose `Err` becomes the push's.
    pub fn receive_keys_with(
        &self,
        receive: impl Fn(&AgentTargetRow, &[u8]) -> Result<(), String> + Send + Sync + 'static,
    ) {
        *self.receiver.lock().unwrap() = Some(Box::new(receive));
    }

    /// Every call of this kind, in order.
    pub fn calls(&self, op: Op) -> Vec<Call> {
        self.all_calls()
            .into_iter()
            .filter(|c| c.op == op)
            .collect()
    }

    /// Wait (at most 10 s) until the hosts have been contacted `n` times for this kind of
    /// call, and return the `n`th call: the event itself, never a guess at how long it
    /// takes.
    pub async fn contacted(&self, op: Op, n: usize) -> Call {
        let wait = async {
            loop {
                let notified = self.called.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                if let Some(c) = self.calls(op).into_iter().nth(n - 1) {
                    return c;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait)
            .await
            .unwrap_or_else(|_| panic!("the hosts were not contacted {n} times for {op:?}"))
    }

    pub fn all_calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    /// Every call as (kind, host id, instance name).
    pub fn log(&self) -> Vec<(&'static str, String, String)> {
        self.all_calls()
            .into_iter()
            .map(|c| (c.op.name(), c.host_id, c.name))
            .collect()
    }

    /// (host id, name) of the containers the hosts run now.
    pub fn containers(&self) -> HashSet<(String, String)> {
        self.containers.lock().unwrap().clone()
    }

    fn script<T>(&self, op: Op, f: impl FnOnce(&mut Script) -> T) -> T {
        f(self.scripts.lock().unwrap().entry(op).or_default())
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.as_ref().map_or_else(Utc::now, Clock::now)
    }

    async fn row_named(&self, name: &str) -> Option<VmRow> {
        let store = self.store.as_ref()?;
        // Rows are read by id; the agent knows only the name, so look through every user's
        // rows the way an operator would.
        for u in store.users_overview().await.unwrap() {
            let epoch = DateTime::<Utc>::UNIX_EPOCH;
            if let Some(r) = store
                .vms_of(&u.user.sub, epoch)
                .await
                .unwrap()
                .into_iter()
                .find(|r| r.name == name)
            {
                return Some(r);
            }
        }
        None
    }

    /// Record the call, let the host take its time, and pick its answer.
    async fn take_call(&self, call: Call) -> Answer {
        let (op, host_id) = (call.op, call.host_id.clone());
        let row = if op == Op::PushKeys {
            None
        } else {
            self.row_named(&call.name).await
        };
        self.calls.lock().unwrap().push(Call {
            at: self.now(),
            row,
            ..call
        });
        self.called.notify_waiters();
        let (takes, delay) = self.script(op, |s| (s.takes, s.delay));
        if let Some(clock) = &self.clock {
            clock.advance(takes);
        }
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        self.script(op, |s| {
            s.queued
                .pop_front()
                .or_else(|| s.per_host.get(&host_id).cloned())
                .or_else(|| s.default.clone())
                .unwrap_or(Answer::Ok)
        })
    }

    fn call(&self, op: Op, host: &AgentTargetRow, name: &str) -> Call {
        Call {
            op,
            host_id: host.id.clone(),
            name: name.to_owned(),
            create: None,
            action: None,
            envelope: None,
            at: DateTime::<Utc>::UNIX_EPOCH,
            row: None,
        }
    }
}

/// A refusal or silence, for the VM calls; `None` for the answers that succeed.
async fn failure(answer: Answer) -> Option<AgentError> {
    match answer {
        Answer::Ok => None,
        Answer::NotFound => Some(AgentError::Refused {
            status: 404,
            code: Some(byo_wire::vm::AgentErrorCode::NotFound),
            reason: "not found".into(),
        }),
        // A refusal with the agent's own text (its code is what the real client parses;
        // here none, so a customer is told the general words).
        Answer::Refused { status, reason } => Some(AgentError::Refused {
            status,
            code: None,
            reason,
        }),
        Answer::Occupied(reason) => Some(AgentError::Occupied(reason)),
        Answer::Unreachable(why) => Some(AgentError::Unreachable(why)),
        Answer::Hang => futures::future::pending().await,
        Answer::Unreadable => None,
    }
}

impl HostAgents for FakeAgents {
    fn push_operator_keys<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        envelope: &'a [u8],
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let call = Call {
                envelope: Some(envelope.to_vec()),
                ..self.call(Op::PushKeys, host, "")
            };
            match self.take_call(call).await {
                Answer::Ok => match &*self.receiver.lock().unwrap() {
                    Some(receive) => receive(host, envelope),
                    None => Ok(()),
                },
                Answer::NotFound => Err("the agent answered 404 Not Found".into()),
                Answer::Refused { status, reason } => {
                    Err(format!("the agent answered {status}: {reason}"))
                }
                Answer::Occupied(reason) => Err(format!("the agent answered 409: {reason}")),
                Answer::Unreachable(why) => Err(why),
                Answer::Hang => futures::future::pending().await,
                Answer::Unreadable => Ok(()),
            }
        })
    }

    fn create_vm<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        req: &'a CreateVm,
    ) -> BoxFuture<'a, Result<Option<VmCreated>, AgentError>> {
        Box::pin(async move {
            let call = Call {
                create: Some(req.clone()),
                ..self.call(Op::Create, host, &req.name)
            };
            let answer = self.take_call(call).await;
            let unreadable = answer == Answer::Unreadable;
            if let Some(e) = failure(answer).await {
                return Err(e);
            }
            self.containers
                .lock()
                .unwrap()
                .insert((host.id.clone(), req.name.clone()));
            if unreadable {
                return Ok(None);
            }
            Ok(Some(VmCreated {
                name: req.name.clone(),
                ssh_port: 2201,
                gpu_check: self.gpu_check.lock().unwrap().clone(),
                startup_script: Advisory {
                    ok: true,
                    detail: None,
                },
            }))
        })
    }

    fn delete_vm<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Gone, AgentError>> {
        Box::pin(async move {
            match self.take_call(self.call(Op::Delete, host, name)).await {
                Answer::Ok => {
                    let key = (host.id.clone(), name.to_owned());
                    if self.containers.lock().unwrap().remove(&key) {
                        Ok(Gone::Deleted)
                    } else {
                        Ok(Gone::NotFound)
                    }
                }
                Answer::NotFound => Ok(Gone::NotFound),
                other => Err(failure(other).await.expect("not a success")),
            }
        })
    }

    fn vm_action<'a>(
        &'a self,
        host: &'a AgentTargetRow,
        name: &'a str,
        action: VmAction,
    ) -> BoxFuture<'a, Result<(), AgentError>> {
        Box::pin(async move {
            let call = Call {
                action: Some(action),
                ..self.call(Op::Power, host, name)
            };
            match failure(self.take_call(call).await).await {
                None => Ok(()),
                Some(e) => Err(e),
            }
        })
    }

    /// A pair's agent: node1 told first (one satellite), node0 in 3 s.
    fn reboot_host<'a>(
        &'a self,
        host: &'a AgentTargetRow,
    ) -> BoxFuture<'a, Result<byo_wire::vm::HostRebooting, AgentError>> {
        Box::pin(async move {
            match failure(self.take_call(self.call(Op::Reboot, host, "")).await).await {
                None => Ok(byo_wire::vm::HostRebooting {
                    node0_in_secs: 3,
                    satellites: vec![byo_wire::vm::SatelliteRebooting {
                        node: 1,
                        rebooting: true,
                        error: None,
                    }],
                }),
                Some(e) => Err(e),
            }
        })
    }
}

/// How [`FakeCustomerSsh`] answers a login.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SshWay {
    /// As the path does when it works: a login with the key a create on these fake hosts
    /// carried lands in that container (`hostname` answers its name) while the host holds
    /// it; any other is not let in.
    Through,
    /// The login fails with this (the relay's :22 blackholed, a refused key…).
    Fails(String),
    /// Logged in, but somewhere else: the command answers this.
    Elsewhere(String),
}

/// The customer's ssh (`providers::customer_ssh`) over [`FakeAgents`]' containers. Records
/// each login's address.
pub struct FakeCustomerSsh {
    agents: Option<std::sync::Arc<FakeAgents>>,
    way: Mutex<SshWay>,
    pub logins: Mutex<Vec<String>>,
}

impl FakeCustomerSsh {
    /// Logins into `agents`' containers, or, without them, none at all.
    pub fn over(agents: Option<std::sync::Arc<FakeAgents>>) -> Self {
        let way = match agents {
            Some(_) => SshWay::Through,
            None => SshWay::Fails("ssh: connect to host port 22: Connection timed out".into()),
        };
        FakeCustomerSsh {
            agents,
            way: Mutex::new(way),
            logins: Mutex::new(Vec::new()),
        }
    }

    pub fn set(&self, way: SshWay) {
        *self.way.lock().unwrap() = way;
    }
}

impl byo_server::providers::customer_ssh::CustomerSsh for FakeCustomerSsh {
    fn run<'a>(
        &'a self,
        login: byo_server::providers::customer_ssh::Login<'a>,
    ) -> BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            self.logins.lock().unwrap().push(login.address.to_owned());
            let public = login.key.public_key().to_openssh().unwrap();
            match self.way.lock().unwrap().clone() {
                SshWay::Fails(e) => Err(e),
                SshWay::Elsewhere(out) => Ok(out),
                SshWay::Through => {
                    let agents = self.agents.as_ref().expect("Through needs agents");
                    let created = agents.calls(Op::Create).into_iter().rev().find(|c| {
                        c.create
                            .as_ref()
                            .is_some_and(|r| r.ssh_public_key == public)
                    });
                    let held = agents.containers();
                    match created {
                        Some(c) if held.contains(&(c.host_id.clone(), c.name.clone())) => {
                            Ok(format!("{}\n", c.name))
                        }
                        _ => Err("root@…: Permission denied (publickey).".into()),
                    }
                }
            }
        })
    }
}

/// A state's hosts faked: their agents are `agents`, and a path walk's login goes into
/// their containers ([`FakeCustomerSsh`]).
pub trait FakeHosts {
    fn with_fake_hosts(self, agents: &std::sync::Arc<FakeAgents>) -> Self;
}

impl FakeHosts for byo_server::AppState {
    fn with_fake_hosts(self, agents: &std::sync::Arc<FakeAgents>) -> Self {
        self.with_agents(agents.clone())
            .with_customer_ssh(std::sync::Arc::new(FakeCustomerSsh::over(Some(
                agents.clone(),
            ))))
    }
}
