//! Step 133: the heartbeat.

use crate::instances::world::*;
use crate::with_world;

fn beat() -> Value {
    json!({
        "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "unknown",
        "gpu": "degraded", "storage": "ok", "instances": 1,
        "details": {"relay_map": "drift_rewritten"}
    })
}

async fn heartbeat(w: &World, auth: Option<&str>, body: &str) -> Reply {
    let mut req =
        Request::post("/api/host/heartbeat").header(header::CONTENT_TYPE, "application/json");
    if let Some(a) = auth {
        req = req.header(header::AUTHORIZATION, a);
    }
    w.app
        .send(req.body(Body::from(body.to_owned())).unwrap())
        .await
}

async fn heartbeat_upserts_host_status_and_refuses_unknown_tokens_identically(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let retired = w
        .host(
            "spark-2",
            Spec {
                retired: true,
                ..Spec::default()
            },
        )
        .await;
    let bearer = |t: &str| format!("Bearer {t}");

    let first = w.clock.now();
    let r = heartbeat(&w, Some(&bearer(&host.token)), &beat().to_string()).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let s = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!(s.seen_at, first, "seen_at is the backend's clock");
    assert_eq!(
        (
            s.lxd.as_deref(),
            s.gpu.as_deref(),
            s.tunnel.as_deref(),
            s.instances
        ),
        (Some("ok"), Some("degraded"), Some("unknown"), Some(1))
    );
    assert_eq!(
        s.details.0.relay_map,
        Some(byo_wire::vm::RelayMapCheck::DriftRewritten)
    );

    // The next beat replaces it: one row per host.
    w.clock.advance(TimeDelta::seconds(30));
    let mut next = beat();
    next["lxd"] = json!("down");
    next["instances"] = json!(0);
    next["agent_version"] = json!("0.1.1");
    let r = heartbeat(&w, Some(&bearer(&host.token)), &next.to_string()).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    let s = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!(s.seen_at, w.clock.now());
    assert_eq!(
        (s.lxd.as_deref(), s.instances, s.agent_version.as_deref()),
        (Some("down"), Some(0), Some("0.1.1"))
    );

    // Whatever is wrong with the credential, one answer — and with a bad body too.
    let unknown = SecretToken::generate(TokenKind::Host);
    let agent_token = SecretToken::generate(TokenKind::Agent);
    let mut answers = HashSet::new();
    let good = beat().to_string();
    for auth in [
        None,
        Some("Bearer".to_owned()),
        Some(bearer("byo_hst_garbage")),
        Some(bearer(unknown.expose())),
        Some(bearer(agent_token.expose())),
        Some(bearer(&retired.token)),
    ] {
        for body in [good.as_str(), "{not json", r#"{"agent_version": ""}"#] {
            let r = heartbeat(&w, auth.as_deref(), body).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{auth:?} {body}");
            answers.insert(r.as_seen());
        }
    }
    assert_eq!(answers.len(), 1, "one identical 401 for every refusal");
    // The host-report refusal is the same answer.
    let report = w
        .app
        .send(
            Request::post("/api/host/report")
                .header(header::AUTHORIZATION, bearer(unknown.expose()))
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await;
    assert!(answers.contains(&report.as_seen()), "headers included");
    assert!(w.db().host_status(&retired.id).await.unwrap().is_none());

    // A live host with a body it cannot use is told so, and nothing changes.
    let before = w.db().host_status(&host.id).await.unwrap().unwrap();
    w.clock.advance(TimeDelta::seconds(30));
    for body in [
        "{not json".to_owned(),
        json!({"agent_version": "", "lxd": "ok", "relay": "ok", "tunnel": "ok", "gpu": "ok", "storage": "ok", "instances": 0}).to_string(),
        {
            let mut b = beat();
            b["details"] = json!("a string");
            b.to_string()
        },
        {
            let mut b = beat();
            b["lxd"] = json!("splendid");
            b.to_string()
        },
        {
            // Inside the wire's 128 bytes, past the rule's 64 characters.
            let mut b = beat();
            b["agent_version"] = json!("v".repeat(65));
            b.to_string()
        },
        {
            let mut b = beat();
            b["agent_version"] = json!("0.1.0\u{1b}[2J");
            b.to_string()
        },
    ] {
        let r = heartbeat(&w, Some(&bearer(&host.token)), &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
    }
    let after = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!((after.seen_at, after.lxd), (before.seen_at, before.lxd));
    // Held instances past their bounds: one instance too many, a status word too long.
    let held = |n: usize, status: &str| {
        let vms: Vec<Value> = (0..n)
            .map(|i| json!({"name": format!("vm-{i:08}"), "status": status}))
            .collect();
        let mut b = beat();
        b["vms"] = json!(vms);
        b.to_string()
    };
    for body in [
        held(byo_wire::vm::MAX_HELD_VMS + 1, "Running"),
        held(1, &"A".repeat(33)),
    ] {
        let r = heartbeat(&w, Some(&bearer(&host.token)), &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    }
    let after = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!(after.seen_at, before.seen_at);
    // At the bounds each is taken: 64 characters of version, as many instances as a
    // host may list, a status word of 32 letters.
    let mut b = beat();
    b["agent_version"] = json!("v".repeat(64));
    for body in [
        b.to_string(),
        held(byo_wire::vm::MAX_HELD_VMS, "Running"),
        held(1, &"A".repeat(32)),
    ] {
        let r = heartbeat(&w, Some(&bearer(&host.token)), &body).await;
        assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    }
}

/// 133: node0 of a pair counts the machines on each of its rail ports, and the beat keeps
/// node0's host_nodes.rails `neighbours_discovered` current — the rest of each port as the
/// rail steps left it, node1's row untouched, nothing of it in host_status. A map that does
/// not read refuses the beat and changes nothing.
async fn k_133_a_pairs_beat_keeps_node0s_rail_neighbours_current(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let rails0 = json!({"rail0": {"index": 0, "address": "192.168.100.10/24", "mtu": 9000,
                                  "neighbours_discovered": 1, "verified_at": "2026-09-08T14:20:03Z"},
                        "rail1": {"index": 1, "address": "192.168.101.10/24", "neighbours_discovered": 1}});
    let rails1 = json!({"rail0": {"index": 1, "neighbours_discovered": 1}});
    for (index, hardware_id, rails) in [(0, "hw0", &rails0), (1, "hw1", &rails1)] {
        w.db()
            .insert_host_node(
                byo_db::hosts::NewHostNode {
                    host_id: &host.id,
                    index,
                    machine_id: None,
                    hardware_id,
                    fingerprint: &json!({}),
                    rails,
                },
                w.clock.now(),
            )
            .await
            .unwrap();
    }
    let rails = async || -> Vec<Value> {
        let nodes = w.db().host_nodes(&host.id).await.unwrap();
        nodes.into_iter().map(|n| n.rails.0).collect()
    };
    let bearer = format!("Bearer {}", host.token);
    let with = |counts: Value| {
        let mut b = beat();
        b["details"]["rail_neighbours"] = counts;
        b.to_string()
    };
    // An instance holds rail1's netdev (it reads zero), and a spare port answers nobody.
    let r = heartbeat(
        &w,
        Some(&bearer),
        &with(json!({"rail0": 1, "rail1": 0, "rail2": 0})),
    )
    .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let mut want = rails0.clone();
    want["rail1"]["neighbours_discovered"] = json!(0);
    want["rail2"] = json!({"neighbours_discovered": 0});
    assert_eq!(rails().await, vec![want.clone(), rails1.clone()]);
    let status = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert!(
        status.details.0.rail_neighbours.is_none(),
        "kept on the node, not here"
    );

    // At the bounds: as many ports as a machine may have, a name of the longest, the most
    // machines a count may say.
    let longest = "p".repeat(byo_wire::limits::SHORT);
    let mut most: serde_json::Map<String, Value> =
        (0..7).map(|i| (format!("spare{i}"), json!(0))).collect();
    most.insert(longest.clone(), json!(byo_wire::vm::MAX_RAIL_NEIGHBOURS));
    let r = heartbeat(&w, Some(&bearer), &with(Value::Object(most))).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let at_bounds = rails().await;
    assert_eq!(
        at_bounds[0][&longest]["neighbours_discovered"],
        byo_wire::vm::MAX_RAIL_NEIGHBOURS
    );
    assert_eq!(at_bounds[0]["spare6"]["neighbours_discovered"], 0);
    assert_eq!(
        at_bounds[0]["rail0"], want["rail0"],
        "a port the beat left out stays"
    );
    let want = at_bounds[0].clone();

    for bad in [
        json!("two"),
        json!({"rail0": -1}),
        json!({"rail0": byo_wire::vm::MAX_RAIL_NEIGHBOURS + 1}),
        json!({"": 1}),
        json!({format!("{longest}p"): 1}),
        json!({"rail\n0": 1}),
        Value::Object((0..9).map(|i| (format!("rail{i}"), json!(1))).collect()),
    ] {
        let r = heartbeat(&w, Some(&bearer), &with(bad.clone())).await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("invalid_heartbeat")),
            "{bad}"
        );
    }
    assert_eq!(rails().await, vec![want, rails1]);
}

/// Issue #37, 2: a host on the last release's agent keeps beating after the details became
/// typed. The beat below is byte for byte what that build's `heartbeat::report` sent (its
/// `json!` spelled every key, nulls included); it lands, and what the backend judges from it
/// reads as before: the drift and the expired list named, the logins kept in their table.
async fn a_beat_from_the_last_releases_agent_still_lands_and_reads_as_before(w: World) {
    let host = w.host("spark-1", Spec::default()).await;
    let old = r#"{"agent_version":"byo-agent 0.1.0 (f849085)","lxd":"ok","relay":"ok","tunnel":"ok","gpu":"ok","storage":"ok","instances":0,
        "details":{"relay_map":"drift_rewritten","relay_drift":{"relay_had":"empty","host_runs":"22->10.8.0.2:22000"},
                   "tunnel":"active","gpu":"NVIDIA GB10","rollback":null,
                   "operator_keys":{"version":3,"expires":"2020-01-01T00:00:00Z"},
                   "operator_logins":[{"at":"2026-12-01T10:00:00Z","source":"10.8.0.1","source_port":40001,
                                       "fingerprint":"SHA256:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"}],
                   "operator_logins_error":null,"half_a_pair":null,"lockstep":null},
        "vms":[]}"#;
    let r = heartbeat(&w, Some(&format!("Bearer {}", host.token)), old).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text());
    let s = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!(
        s.details.0.relay_map,
        Some(byo_wire::vm::RelayMapCheck::DriftRewritten)
    );
    assert_eq!(
        s.details.0.operator_keys.as_ref().map(|k| k.version),
        Some(3)
    );
    assert!(
        s.details.0.operator_logins.is_none(),
        "kept in their own table"
    );
    let page = w.op.page(&format!("/admin/hosts/{}", host.id)).await;
    for named in ["relay map drift", "key list expired"] {
        assert!(page.contains(named), "{named} missing");
    }
}

with_world!(
    heartbeat_upserts_host_status_and_refuses_unknown_tokens_identically,
    k_133_a_pairs_beat_keeps_node0s_rail_neighbours_current,
    a_beat_from_the_last_releases_agent_still_lands_and_reads_as_before,
);
