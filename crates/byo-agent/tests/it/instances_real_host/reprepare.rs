//! Host configuration after go-live (L; issue #14 item 6): `byo-agent prepare --again`, the
//! deliberate run an operator makes, on the prepared host with serving running under
//! systemd. Refused while an instance holds the rails and while the VM API holds the lock,
//! nothing changed; on an idle host every step's check runs again (each reported to the
//! backend with attempt 1, none taken from the done list) while serving keeps answering; a
//! failed step is reported and left — nothing undone, serving untouched, no rollback.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use serde_json::Value;

use super::World;
use super::support::prepared::text;

/// `byo-agent prepare --again` (optionally under a wrapper such as `flock`): its exit status
/// and everything it said.
fn again(w: &World, wrapper: &[&str]) -> (i32, String) {
    let mut argv: Vec<&str> = wrapper.to_vec();
    argv.extend(["/usr/local/bin/byo-agent", "prepare", "--again"]);
    let started = Instant::now();
    let out = w.host.exec(&argv);
    let said = text(&out);
    eprintln!(
        "--- {} ({:.1} s, exit {:?})\n{said}",
        argv.join(" "),
        started.elapsed().as_secs_f64(),
        out.status.code()
    );
    (out.status.code().unwrap_or(-1), said)
}

/// What a refused or a failed run must leave as it was: the done list, the hand-over
/// record, the credentials and the kept key list (digests, owners, modes, mtimes), serving's
/// process and invocation, the prepare unit's invocation, the rollback unit never run, what
/// LXD holds, earlyoom's state.
fn host_facts(w: &World) -> String {
    w.host.sh_ok(
        "cd / && for f in var/lib/enverge-agent/prepare-done.json etc/enverge/serving.json \
           etc/enverge/credentials.json etc/enverge/operator-keys.signed; do \
           echo \"$f $(sha256sum < $f | cut -c1-16) $(stat -c '%U %a %Y' $f)\"; done
         systemctl show enverge-agent.service -p MainPID -p InvocationID -p NRestarts
         systemctl show enverge-agent-prepare.service -p InvocationID
         systemctl show enverge-agent-rollback.service -p InvocationID -p ActiveState
         test ! -e /etc/enverge/rolled-back.json && echo no-rollback-record
         lxc list --format csv -c ns
         systemctl is-enabled earlyoom.service || true",
    )
}

/// serving as the backend sees it, unchanged: the same process, never restarted, and the
/// rollback never fired.
fn serving_untouched(w: &World, before: &str) {
    let now = w
        .host
        .sh_ok("systemctl show enverge-agent.service -p MainPID -p InvocationID -p NRestarts");
    for line in now.lines() {
        assert!(
            before.contains(line),
            "serving changed: {line}\nbefore:\n{before}"
        );
    }
    let rollback = w.host.sh_ok(
        "systemctl show enverge-agent-rollback.service -p InvocationID --value; test ! -e /etc/enverge/rolled-back.json && echo none",
    );
    assert_eq!(rollback.trim(), "none", "the rollback fired: {rollback}");
    // Its answer in full when it is not a 200: once (stop 31) a 500 came right after a run
    // whose ten polls were all 200, and did not come again on a rerun.
    let (status, body) = w.api("GET", "/v1/vms", None);
    assert_eq!(
        status,
        200,
        "serving answers: {body}\n{}",
        lxd_and_serving(w)
    );
}

/// LXD's and serving's journals this boot, for a VM API answer that is not a 200: whether
/// LXD was restarting then is the diagnosis.
fn lxd_and_serving(w: &World) -> String {
    w.host.sh_ok(
        "date '+now %s.%N %FT%T.%N'; journalctl -b -u lxd.service -u lxd.socket -u enverge-agent.service \
         -o short-iso-precise --no-pager | tail -n 80; tail -n 30 /var/log/lxd/lxd.log",
    )
}

/// The run as docs/upgrades.md tells the operator to start it: detached under systemd, so a
/// dropped session cannot cut it; its exit status and its journal.
fn again_detached(w: &World) -> (i32, String) {
    let started = Instant::now();
    let out = w.host.exec(&[
        "systemd-run",
        "--unit=enverge-agent-reprepare",
        "--collect",
        "--wait",
        "--quiet",
        "/usr/local/bin/byo-agent",
        "prepare",
        "--again",
    ]);
    let said = w
        .host
        .sh_ok("journalctl -b -u enverge-agent-reprepare.service -o cat --no-pager | tail -n 80");
    eprintln!(
        "--- systemd-run … byo-agent prepare --again ({:.1} s, exit {:?})\n{}{said}",
        started.elapsed().as_secs_f64(),
        out.status.code(),
        text(&out)
    );
    (out.status.code().unwrap_or(-1), said)
}

fn reports_since(w: &World, from: usize) -> Vec<Value> {
    w.mapd.reports.lock().unwrap()[from..].to_vec()
}

pub fn l_prepare_again_is_refused_while_an_instance_holds_the_rails(w: &World) {
    assert!(w.instances().contains("c1,RUNNING"), "{}", w.instances());
    let reports = w.mapd.reports.lock().unwrap().len();
    let before = host_facts(w);
    let (code, said) = again(w, &[]);
    assert_eq!(code, 3, "{said}");
    assert!(
        said.contains("an instance holds the rails: c1 running on this host")
            && said.contains("Nothing was changed"),
        "{said}"
    );
    // While the VM API is creating or starting one (it holds the lock shared), the run is
    // refused too: flock(1) holds it for the run's whole length.
    let (code, said) = again(w, &["flock", "-s", "/var/lib/enverge-agent/prepare.lock"]);
    assert_eq!(code, 5, "{said}");
    assert!(
        said.contains("creating or starting an instance right now")
            && said.contains("Nothing was changed"),
        "{said}"
    );
    assert_eq!(host_facts(w), before, "a refused run changed the host");
    assert!(
        reports_since(w, reports).is_empty(),
        "a refused run reported progress"
    );
}

pub fn l_prepare_again_on_an_idle_host_checks_every_step_and_serving_keeps_answering(w: &World) {
    // Idle: the customer's instance is stopped, which does not hold the rails.
    assert_eq!(w.instances().trim(), "c1,STOPPED");
    let reports = w.mapd.reports.lock().unwrap().len();
    let before = host_facts(w);
    let done_before = w
        .host
        .sh_ok("stat -c %Y /var/lib/enverge-agent/prepare-done.json");
    let stop = AtomicBool::new(false);
    let (run, polls) = std::thread::scope(|s| {
        let poller = s.spawn(|| {
            let mut polls = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                // The body too when it is not a 200: what serving said is the diagnosis.
                let (status, body) = w.api("GET", "/v1/vms", None);
                let said = (status != 200).then(|| (std::time::SystemTime::now(), body));
                polls.push((Instant::now(), status, said));
            }
            polls
        });
        let run = again_detached(w);
        stop.store(true, Ordering::Relaxed);
        (run, poller.join().unwrap())
    });
    let (code, said) = run;
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("(again, deliberately: every step is checked"),
        "{said}"
    );
    assert!(
        said.contains("prepared again: every step checked"),
        "{said}"
    );
    // Serving answered throughout: every poll during the run was a 200.
    assert!(!polls.is_empty());
    let failed: Vec<_> = polls.iter().filter(|(_, s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "serving did not answer during the run: {failed:?}\n{}",
        lxd_and_serving(w)
    );
    let longest = polls
        .windows(2)
        .map(|p| p[1].0 - p[0].0)
        .max()
        .unwrap_or_default();
    eprintln!(
        "prepare --again on an idle host: {} polls of the VM API during the run, all 200, longest gap {} ms",
        polls.len(),
        longest.as_millis()
    );
    serving_untouched(w, &before);
    // Every step of the registry was checked by this run (attempt 1), or skipped with its
    // reason; none was taken from the done list (attempt 0), and the last report completed.
    let sent = reports_since(w, reports);
    for step in byo_agent::prepare::STEP_NAMES {
        let r = sent
            .iter()
            .rfind(|r| r["state"]["step"] == *step)
            .unwrap_or_else(|| panic!("{step} was not reported: {sent:#?}"));
        let state = r["state"]["state"].as_str().unwrap();
        match state {
            "satisfied" | "applied" => assert_eq!(r["state"]["attempt"], 1, "{step}: {r}"),
            "skipped" => assert!(r["state"]["error"].is_string(), "{step}: {r}"),
            other => panic!("{step} ended {other}: {r}"),
        }
    }
    assert_eq!(sent.last().unwrap()["completed"], true, "{sent:#?}");
    // The done list was written again, by this run, with every step.
    let done: Value = serde_json::from_slice(
        &w.host
            .read("/var/lib/enverge-agent/prepare-done.json")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        done["steps"].as_array().unwrap().len(),
        byo_agent::prepare::STEP_NAMES.len()
    );
    assert_ne!(
        w.host
            .sh_ok("stat -c %Y /var/lib/enverge-agent/prepare-done.json"),
        done_before,
        "the done list was not rewritten"
    );
    // Nothing about the instance changed.
    assert_eq!(w.instances().trim(), "c1,STOPPED");
}

pub fn l_a_failed_step_of_prepare_again_is_reported_and_left(w: &World) {
    // The host's own state breaks a step: earlyoom masked (the apply's enable is refused).
    w.host.sh_ok("systemctl mask earlyoom.service");
    let reports = w.mapd.reports.lock().unwrap().len();
    let before = host_facts(w);
    let (code, said) = again(w, &[]);
    assert_eq!(code, 1, "{said}");
    assert!(
        said.contains("re-prepare failed at earlyoom: apply failed")
            && said.contains("masked")
            && said.contains("Nothing was rolled back and serving keeps running"),
        "{said}"
    );
    // Reported by name, the run stopped there.
    let sent = reports_since(w, reports);
    let last = sent.last().expect("reports");
    assert_eq!(last["state"]["step"], "earlyoom", "{sent:#?}");
    assert_eq!(last["state"]["state"], "failed");
    assert_eq!(last["completed"], false);
    assert!(
        last["state"]["error"].as_str().unwrap().contains("masked"),
        "{last}"
    );
    assert!(
        !sent.iter().any(|r| r["state"]["step"] == "watchdog"),
        "the run went past the failed step"
    );
    // Left as it is: earlyoom still masked, the steps before it kept as completed by this
    // build, serving untouched, no rollback.
    assert_eq!(
        w.host
            .sh_ok("systemctl is-enabled earlyoom.service || true")
            .trim(),
        "masked"
    );
    let done: Value = serde_json::from_slice(
        &w.host
            .read("/var/lib/enverge-agent/prepare-done.json")
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        done["steps"],
        serde_json::json!(["operator-access", "docker-purge", "swap-off"]),
        "{done}"
    );
    serving_untouched(w, &before);
    assert_eq!(w.instances().trim(), "c1,STOPPED");

    // The cause fixed, the operator runs it again: it completes.
    w.host.sh_ok("systemctl unmask earlyoom.service");
    let (code, said) = again(w, &[]);
    assert_eq!(code, 0, "{said}");
    serving_untouched(w, &before);
}
