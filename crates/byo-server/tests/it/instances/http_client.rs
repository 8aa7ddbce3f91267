//! The real client, `HttpAgents`, against a stub of the agent's VM API.

use crate::instances::world::*;
use crate::support::relay_tls;

/// HttpAgents against a stub of the agent's VM API on loopback: the sealed token is
/// opened and presented, a create's answer is read, and only the agent's own 404 confirms
/// a delete — a 404 from something that does not know the route does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_client_speaks_the_agents_vm_api() {
    use axum::Router;
    use axum::extract::Path;
    use axum::routing::{delete, post};
    use byo_server::relay_ca::{RelayCa, RelayCaSource, relay_name};
    use byo_server::seal::{SealedAt, Sealer};

    let token = SecretToken::generate(TokenKind::Agent);
    let expected = format!("Bearer {}", token.expose());
    let authorised = move |h: &axum::http::HeaderMap| {
        h.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) == Some(expected.as_str())
    };
    let (a1, a2, a3) = (authorised.clone(), authorised.clone(), authorised);
    let agent = Router::new()
        .route(
            "/v1/vms",
            post(move |h: axum::http::HeaderMap, body: String| async move {
                if !a1(&h) {
                    return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                }
                let req: Value = serde_json::from_str(&body).unwrap();
                let name = req["name"].as_str().unwrap().to_owned();
                if name == "vm-garbled" {
                    return (StatusCode::CREATED, "not json".to_owned());
                }
                if name == "vm-second" {
                    return (
                        StatusCode::CONFLICT,
                        json!({"error": "host_occupied", "message": "this host already holds instance vm-first (one instance per host); nothing was created"}).to_string(),
                    );
                }
                if name == "vm-preparing" {
                    return (
                        StatusCode::CONFLICT,
                        json!({"error": "host_preparing", "message": "an operator is preparing this host again (make byo-prepare); nothing was done: try another host, or this one when the run has finished"}).to_string(),
                    );
                }
                if name == "vm-taken" {
                    return (
                        StatusCode::CONFLICT,
                        json!({"error": "conflict", "message": "an instance named vm-taken already exists"}).to_string(),
                    );
                }
                let created = json!({"name": name, "ssh_port": 2203,
                    "gpu_check": {"ok": true}, "startup_script": {"ok": true}});
                (StatusCode::CREATED, created.to_string())
            }),
        )
        .route(
            "/v1/vms/{name}",
            delete(move |h: axum::http::HeaderMap, Path(name): Path<String>| async move {
                if !a2(&h) {
                    return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                }
                match name.as_str() {
                    "vm-here" => (StatusCode::OK, json!({"deleted": true}).to_string()),
                    "vm-gone" => (
                        StatusCode::NOT_FOUND,
                        json!({"error": "not_found", "message": "no such instance on this host"}).to_string(),
                    ),
                    _ => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        json!({"error": "failed", "message": "lxd: busy"}).to_string(),
                    ),
                }
            }),
        )
        .route(
            "/v1/vms/{name}/state",
            post(move |h: axum::http::HeaderMap| async move {
                if a3(&h) { StatusCode::NO_CONTENT } else { StatusCode::UNAUTHORIZED }
            }),
        );
    // The agent behind its relay's TLS front, with the certificate relay-provision issues.
    let ca = RelayCa::generate().unwrap();
    let public_url = "http://10.0.0.1:8080";
    let name = relay_name("spark-1", public_url);
    let cert = ca.issue(&name, chrono::Utc::now()).unwrap();
    let (port, _) = relay_tls::serve(agent.clone(), &cert).await;
    // An agent with no VM API at all: its 404s are the router's, with no body.
    let (old_port, _) = relay_tls::serve(Router::new(), &cert).await;
    // Fronts the client must refuse before it sends anything: another CA's certificate for
    // this relay's name, and this CA's certificate for another relay.
    let stranger = RelayCa::generate()
        .unwrap()
        .issue(&name, chrono::Utc::now())
        .unwrap();
    let (stranger_port, stranger_reached) = relay_tls::serve(agent.clone(), &stranger).await;
    let other_relay = ca
        .issue(&relay_name("spark-2", public_url), chrono::Utc::now())
        .unwrap();
    let (other_port, other_reached) = relay_tls::serve(agent, &other_relay).await;

    let sealer = Sealer::from_hex(&Sealer::generate_hex()).unwrap();
    let target = AgentTargetRow {
        id: "h".into(),
        slug: "spark-1".into(),
        relay_ip: Some("127.0.0.1".into()),
        agent_token: Some(sealer.seal(&SealedAt::agent_token("h"), token.expose())),
    };
    let trust = RelayCaSource::fixed(ca);
    let client_on = |port: u16| {
        HttpAgents::new(Some(sealer.clone()), trust.clone(), public_url).with_port(port)
    };
    let client = client_on(port);
    let create = |name: &str| CreateVm {
        name: name.into(),
        ssh_public_key: public_key_line(),
        ssh_hostname: None,
    };

    let created = client.create_vm(&target, &create("vm-here")).await.unwrap();
    assert_eq!(created.unwrap().ssh_port, 2203);
    assert_eq!(
        client.create_vm(&target, &create("vm-garbled")).await,
        Ok(None),
        "an unreadable 2xx is still a success"
    );
    assert_eq!(
        client.create_vm(&target, &create("vm-taken")).await,
        Err(AgentError::Refused {
            status: 409,
            code: Some(byo_wire::vm::AgentErrorCode::Conflict),
            reason: "an instance named vm-taken already exists".into()
        })
    );
    assert_eq!(
        client.create_vm(&target, &create("vm-second")).await,
        Err(AgentError::Occupied(
            "this host already holds instance vm-first (one instance per host); nothing was created"
                .into()
        )),
        "host_occupied is told apart from other refusals"
    );
    assert!(
        matches!(
            client.create_vm(&target, &create("vm-preparing")).await,
            Err(AgentError::Occupied(reason)) if reason.contains("preparing this host again")
        ),
        "host_preparing (a deliberate re-prepare holds the host) is no capacity, as host_occupied"
    );
    assert_eq!(
        client.delete_vm(&target, "vm-here").await,
        Ok(Gone::Deleted)
    );
    assert_eq!(
        client.delete_vm(&target, "vm-gone").await,
        Ok(Gone::NotFound)
    );
    assert!(matches!(
        client.delete_vm(&target, "vm-busy").await,
        Err(AgentError::Refused { status: 500, .. })
    ));
    assert!(matches!(
        client.delete_vm(&target, "../etc").await,
        Err(AgentError::Refused { status: 400, .. })
    ));
    assert_eq!(
        client.vm_action(&target, "vm-here", VmAction::Reboot).await,
        Ok(())
    );

    let wrong = AgentTargetRow {
        agent_token: Some(sealer.seal(
            &SealedAt::agent_token("h"),
            SecretToken::generate(TokenKind::Agent).expose(),
        )),
        ..target.clone()
    };
    assert!(matches!(
        client.delete_vm(&wrong, "vm-here").await,
        Err(AgentError::Refused { status: 401, .. })
    ));
    let old_client = client_on(old_port);
    assert!(
        matches!(
            old_client.delete_vm(&target, "vm-gone").await,
            Err(AgentError::Refused { status: 404, .. })
        ),
        "a 404 that is not the agent's own does not confirm"
    );
    // Nothing listening: never answered.
    drop(client);
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_port = closed.local_addr().unwrap().port();
    drop(closed);
    let nobody = client_on(closed_port);
    assert!(matches!(
        nobody.create_vm(&target, &create("vm-x")).await,
        Err(AgentError::Unreachable(_))
    ));

    // A relay whose certificate is not this relay's from this installation's CA gets
    // nothing: the handshake fails, so no request (and no token) is sent.
    for (what, port, reached) in [
        ("another CA", stranger_port, &stranger_reached),
        ("another relay's name", other_port, &other_reached),
    ] {
        let refused = client_on(port).create_vm(&target, &create("vm-x")).await;
        assert!(
            matches!(&refused, Err(AgentError::Unreachable(why)) if why.contains("certificate")),
            "{what}: {refused:?}"
        );
        let pushed = client_on(port)
            .push_operator_keys(&target, b"{}")
            .await
            .unwrap_err();
        assert!(pushed.contains("certificate"), "{what}: {pushed}");
        assert_eq!(
            reached.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "{what}: a request got through"
        );
    }
}
