//! Fuzzing the parsers that face hosts and operators (#16 item 9), with `bolero` on the
//! stable toolchain: under `cargo test` each target runs the inputs kept in
//! `tests/__fuzz__/fuzz__<target>/corpus/` (real examples from the tests) and then
//! `ITERATIONS` random ones (`BOLERO_RANDOM_ITERATIONS` overrides), half of them raw bytes
//! and half a corpus example with bytes overwritten, inserted or deleted, so near-valid
//! inputs are reached too. `cargo bolero test` runs the same targets under a coverage-guided engine.
//!
//! Every target asserts the parser never panics and that what it accepts round-trips and
//! keeps its invariants.

use bolero::check;
use byo_core::keylist::{self, KeyList, SignedList};
use byo_core::testing::fuzz::{self, input};
use byo_wire::enroll::EnrollRequest;
use byo_wire::limits::Bounded;
use byo_wire::prepare::HostReport;
use byo_wire::profile::ProfilePlan;
use chrono::{DateTime, Utc};

const ITERATIONS: usize = 20_000;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    fuzz::corpus(env!("CARGO_MANIFEST_DIR"), target)
}

fn now() -> DateTime<Utc> {
    "2026-12-01T00:00:00Z".parse().unwrap()
}

/// Step 126's enrolment request, as `POST /api/enroll` reads it, and redeem's judge on it.
#[test]
fn enrolment_request() {
    let seeds = corpus("enrolment_request");
    let plan = |json: &str| serde_json::from_str::<ProfilePlan>(json).unwrap();
    let plans = [
        plan("{}"),
        plan(
            r#"{"gpu_model": "GB10", "gpu_count": 1, "gpu_mem_mib": 122880, "arch": "aarch64",
                "cuda_repo_arch": "sbsa", "node_count": 2,
                "rails": [{"index": 0, "subnet": "192.168.100.0/24", "mtu": 9000},
                          {"index": 1, "subnet": "192.168.101.0/24", "mtu": 9000}]}"#,
        ),
    ];
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let data = input(&seeds, bytes);
            let Ok(req) = serde_json::from_slice::<EnrollRequest>(&data) else {
                return;
            };
            let _ = req.check_bounds();
            let again: EnrollRequest =
                serde_json::from_slice(&serde_json::to_vec(&req).unwrap()).unwrap();
            assert_eq!(again, req, "an accepted request round-trips");
            for plan in &plans {
                if let Ok(rows) = byo_core::redeem::judge(plan, &req) {
                    // At most the plan's machines, node 0 the enroller, each index and
                    // each machine once.
                    assert!(rows.len() as u32 <= plan.node_count.max(1));
                    assert_eq!(rows[0].index, 0, "node 0 is the enroller");
                    let indexes: std::collections::BTreeSet<_> =
                        rows.iter().map(|r| r.index).collect();
                    let machines: std::collections::BTreeSet<_> =
                        rows.iter().map(|r| &r.hardware_id).collect();
                    assert_eq!((indexes.len(), machines.len()), (rows.len(), rows.len()));
                }
            }
        });
}

/// host-report, as `POST /api/host/report` reads it.
#[test]
fn host_report() {
    let seeds = corpus("host_report");
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let data = input(&seeds, bytes);
            let Ok(report) = serde_json::from_slice::<HostReport>(&data) else {
                return;
            };
            let _ = report.check_bounds();
            let again: HostReport =
                serde_json::from_slice(&serde_json::to_vec(&report).unwrap()).unwrap();
            assert_eq!(again, report, "an accepted report round-trips");
        });
}

/// The key list's envelope and body (M), and the one verifier over both.
#[test]
fn key_list() {
    let mut seeds = corpus("key_list");
    let pinned = byo_core::keylist_testing::private_key();
    // A list the pinned key really signed, so the verifier's accepting path is reached.
    let login = byo_core::keylist_testing::login_key("op-1", "laptop");
    let list = byo_core::keylist_testing::list("production", 3, vec![login], now());
    seeds.push(byo_core::keylist_testing::envelope(&list, &[&pinned]));
    seeds.push(list.to_canonical().into_bytes());
    if std::env::var_os("BYO_FUZZ_WRITE_SEEDS").is_some() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/__fuzz__/fuzz__key_list/corpus");
        std::fs::write(dir.join("envelope.json"), &seeds[seeds.len() - 2]).unwrap();
        std::fs::write(dir.join("body.json"), &seeds[seeds.len() - 1]).unwrap();
    }
    let trusted = [pinned.public_key().clone()];
    check!()
        .with_iterations(ITERATIONS)
        .for_each(|bytes: &[u8]| {
            let data = input(&seeds, bytes);
            if let Ok(signed) = SignedList::from_bytes(&data) {
                assert_eq!(
                    SignedList::from_bytes(&signed.to_bytes()).unwrap(),
                    signed,
                    "an accepted envelope round-trips"
                );
                if let Ok(list) = KeyList::from_canonical(&signed.body) {
                    assert_eq!(list.to_canonical(), signed.body, "one byte form per list");
                    if let Ok(keys) = list.check() {
                        assert_eq!(keys.len(), list.keys.len(), "every key checked");
                    }
                    let _ = list.successors();
                }
            }
            if let Ok(body) = std::str::from_utf8(&data)
                && let Ok(list) = KeyList::from_canonical(body)
            {
                assert_eq!(list.to_canonical(), body);
            }
            if let Ok(verified) = keylist::verify(&data, &trusted, "production", None, now()) {
                let signed = SignedList::from_bytes(&data).unwrap();
                assert_eq!(
                    verified.list.to_canonical(),
                    signed.body,
                    "what verifies is the body that was signed"
                );
                assert!(keylist::valid_signers(&signed.body, &signed.signatures, &trusted) >= 1);
            }
        });
}
