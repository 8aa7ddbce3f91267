//! relay-provision's `gcp` client against a fake Compute Engine that keeps the real API's
//! shapes: the service-account JWT grant, long-running operations that are not done on the
//! first look, 404s for what is gone, "resource in use" for an address still attached, and
//! the quirk provisioning note 5 records — `natIP` must be the address literal; a self-link
//! is answered 400.

use crate::support;

use std::process::Command;

use byo_server::providers::RelayProvider;
use serde_json::{Value, json};
use support::fake_gcp::{self, FakeGcp, client};

async fn world() -> FakeGcp {
    fake_gcp::start().await
}

#[tokio::test]
async fn relay_provision_reserves_the_address_and_creates_the_relay_with_the_literal() {
    let w = world().await;
    let info = w
        .relays
        .provision("spark-7", Some("#!/usr/bin/env bash\necho hi\n"))
        .await;
    let info = match info {
        Ok(i) => i,
        Err(e) if e.0.contains("Invalid JWT") => panic!("the JWT grant was refused: {e}"),
        Err(e) => panic!("{e}"),
    };
    assert_eq!(
        (info.name.as_str(), info.address.as_str()),
        ("spark-7-relay", "34.1.2.1")
    );
    let f = w.fake.lock().unwrap();
    assert_eq!(
        f.addresses.get("spark-7-relay-ip").map(String::as_str),
        Some("34.1.2.1")
    );
    let instance = &f.instances["spark-7-relay"];
    assert_eq!(
        instance["networkInterfaces"][0]["accessConfigs"][0]["natIP"],
        "34.1.2.1"
    );
    assert_eq!(instance["metadata"]["items"][0]["key"], "startup-script");
    assert_eq!(
        instance["metadata"]["items"][0]["value"],
        "#!/usr/bin/env bash\necho hi\n"
    );
    assert_eq!(instance["canIpForward"], true);
    assert!(f.polls >= 2, "operations were followed to DONE");
}

#[tokio::test]
async fn provisioning_again_changes_nothing_and_release_leaves_nothing() {
    let w = world().await;
    let first = w.relays.provision("spark-7", Some("script")).await.unwrap();
    let again = w.relays.provision("spark-7", Some("script")).await.unwrap();
    assert_eq!(first, again);
    assert_eq!(w.fake.lock().unwrap().instances.len(), 1);
    w.relays.release("spark-7").await.unwrap();
    {
        let f = w.fake.lock().unwrap();
        assert!(
            f.instances.is_empty() && f.addresses.is_empty(),
            "instance and address both gone"
        );
    }
    // Releasing what is gone succeeds: reap is idempotent.
    w.relays.release("spark-7").await.unwrap();
}

#[tokio::test]
async fn no_bootstrap_means_no_relay() {
    let w = world().await;
    let err = w.relays.provision("spark-8", None).await.unwrap_err();
    assert!(err.0.contains("relay_release"), "{err}");
    let f = w.fake.lock().unwrap();
    assert!(
        f.addresses.is_empty() && f.instances.is_empty(),
        "nothing was reserved"
    );
}

#[tokio::test]
async fn the_fake_answers_a_self_link_nat_ip_with_400_as_gcp_does() {
    let w = world().await;
    w.relays.provision("spark-9", Some("script")).await.unwrap();
    let self_link = format!(
        "{}/compute/v1/projects/byo-test/regions/europe-west4/addresses/spark-9-relay-ip",
        w.base
    );
    let resp = reqwest::Client::new()
        .post(format!("{}/compute/v1/projects/byo-test/zones/europe-west4-a/instances", w.base))
        .bearer_auth("fake-access-token")
        .json(&json!({"name": "other-relay", "networkInterfaces": [{"accessConfigs": [{"natIP": self_link}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"]["message"].as_str().unwrap().contains("natIP"));
}

#[tokio::test]
async fn a_service_account_key_that_does_not_match_is_refused_cleanly() {
    let w = world().await;
    let other = tempfile::tempdir().unwrap();
    let key = other.path().join("other.pem");
    assert!(
        Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out"
            ])
            .arg(&key)
            .output()
            .unwrap()
            .status
            .success()
    );
    let wrong = client(&w.base, &key);
    let err = wrong
        .provision("spark-10", Some("script"))
        .await
        .unwrap_err();
    assert!(err.0.contains("token endpoint refused"), "{err}");
    assert!(w.fake.lock().unwrap().addresses.is_empty());
}
