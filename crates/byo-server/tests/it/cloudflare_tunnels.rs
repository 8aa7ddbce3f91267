//! The `cloudflare` tunnel provider against a fake Cloudflare API that keeps the real one's
//! shapes: the `{success, errors, result}` envelope, tunnels found by name, the connector
//! token as a bare string result, and a second CNAME for one name refused with 81053.

use crate::support;

use byo_server::providers::TunnelProvider;
use byo_server::providers::cloudflare::CloudflareTunnels;
use serde_json::{Value, json};
use support::fake_cloudflare::{self, Shared};

async fn world(api_token: &str) -> (Shared, CloudflareTunnels) {
    fake_cloudflare::start(api_token).await
}

#[tokio::test]
async fn the_operator_tunnel_gets_its_ingress_its_name_and_a_connector_token() {
    let (fake, cf) = world("cf-token").await;
    let t = cf.create("spark-7").await.unwrap();
    assert_eq!(t.hostname, "spark-7.hosts.example.com");
    assert!(t.connector_token.starts_with("eyJ"));
    let f = fake.lock().unwrap();
    assert_eq!(f.tunnels.len(), 1);
    let ingress = &f.configs[&t.id]["ingress"];
    assert_eq!(
        ingress[0],
        json!({"hostname": "spark-7.hosts.example.com", "service": "ssh://localhost:22"})
    );
    assert_eq!(
        ingress[1]["service"], "http_status:404",
        "nothing else is served"
    );
    let record = f.records.values().next().unwrap();
    assert_eq!(record["type"], "CNAME");
    assert_eq!(record["content"], format!("{}.cfargotunnel.com", t.id));
    assert_eq!(record["proxied"], true);
}

#[tokio::test]
async fn creating_again_and_deleting_twice_are_calm() {
    let (fake, cf) = world("cf-token").await;
    let first = cf.create("spark-7").await.unwrap();
    let again = cf.create("spark-7").await.unwrap();
    assert_eq!(first.id, again.id, "found by name, not made twice");
    {
        let f = fake.lock().unwrap();
        assert_eq!(
            (f.tunnels.len(), f.records.len()),
            (1, 1),
            "no second tunnel, no 81053"
        );
    }
    cf.delete("spark-7").await.unwrap();
    {
        let f = fake.lock().unwrap();
        assert!(f.tunnels.is_empty() && f.records.is_empty());
    }
    cf.delete("spark-7").await.unwrap();
}

#[tokio::test]
async fn a_bad_api_token_is_a_clear_error_and_creates_nothing() {
    let (fake, cf) = world("wrong").await;
    let err = cf.create("spark-7").await.unwrap_err();
    assert!(err.0.contains("Authentication error"), "{err}");
    assert!(fake.lock().unwrap().tunnels.is_empty());
}

#[tokio::test]
async fn the_customer_ssh_wildcard_is_a_dns_only_a_record_pointed_again_and_removed() {
    let (fake, cf) = world("cf-token").await;
    let name = "*.spark-7.ssh.example.com";
    cf.point_ssh_wildcard(name, "203.0.113.7").await.unwrap();
    cf.point_ssh_wildcard(name, "203.0.113.7").await.unwrap();
    let records = |f: &Shared| -> Vec<Value> {
        f.lock()
            .unwrap()
            .records
            .values()
            .filter(|r| r["name"] == name)
            .cloned()
            .collect()
    };
    let r = records(&fake);
    assert_eq!(r.len(), 1, "idempotent: {r:?}");
    assert_eq!(
        (
            r[0]["type"].as_str(),
            r[0]["content"].as_str(),
            r[0]["proxied"].as_bool()
        ),
        (Some("A"), Some("203.0.113.7"), Some(false))
    );
    // A replaced relay: the same record, pointed at the new address.
    cf.point_ssh_wildcard(name, "198.51.100.9").await.unwrap();
    let r = records(&fake);
    assert_eq!(
        (r.len(), r[0]["content"].as_str()),
        (1, Some("198.51.100.9"))
    );
    cf.remove_ssh_wildcard(name).await.unwrap();
    cf.remove_ssh_wildcard(name).await.unwrap();
    assert!(records(&fake).is_empty());
}
