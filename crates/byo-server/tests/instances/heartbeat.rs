//! Step 133: the heartbeat.

use crate::with_world;
use crate::world::*;

fn beat() -> Value {
    json!({
        "agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "unknown",
        "gpu": "degraded", "storage": "ok", "instances": 1,
        "details": {"relay_map": "rewritten"}
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
    assert_eq!(s.details.0["relay_map"], "rewritten");

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
    ] {
        let r = heartbeat(&w, Some(&bearer(&host.token)), &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text());
    }
    let after = w.db().host_status(&host.id).await.unwrap().unwrap();
    assert_eq!((after.seen_at, after.lxd), (before.seen_at, before.lxd));
}

with_world!(heartbeat_upserts_host_status_and_refuses_unknown_tokens_identically,);
