//! Races through the API: two customers' creates for one of two free hosts.

use crate::instances::world::*;
use crate::with_world;

/// E1, "another create took this host between the pick and the insert": two creates start
/// together and both pick the same first host (the pick's order is fixed); the one whose
/// insert loses to `vms_one_live_per_host` walks on to the next free host. Both land, on
/// different hosts. Run over several rounds (two fresh hosts, two fresh customers each) so
/// the picks overlap on every backend.
async fn e1_two_creates_racing_for_two_free_hosts_both_land_on_different_hosts(w: World) {
    for round in 0..6 {
        let a = w.host(&format!("spark-a{round}"), Spec::default()).await;
        let b = w.host(&format!("spark-b{round}"), Spec::default()).await;
        let mut customers = Vec::new();
        for who in ["x", "y"] {
            let user = w.app.customer(&format!("{who}{round}@example.com")).await;
            let key = w.add_key(&user).await;
            customers.push((user, key));
        }
        let start = Arc::new(tokio::sync::Barrier::new(2));
        let creates: Vec<_> = customers
            .iter()
            .map(|(user, key)| {
                let (user, key, start) = (user.clone(), key.clone(), start.clone());
                tokio::spawn(async move {
                    start.wait().await;
                    user.post(
                        "/api/vms",
                        json!({"gpu_type": "spark-1", "ssh_key_id": key}),
                    )
                    .await
                })
            })
            .collect();
        let mut landed = HashSet::new();
        for c in creates {
            let r = c.await.unwrap();
            assert_eq!(r.status, StatusCode::CREATED, "round {round}: {}", r.text());
            let id = r.json()["instance"]["id"].as_str().unwrap().to_owned();
            let row = w.vm(&id).await;
            assert_eq!(row.status, VmStatus::Running);
            landed.insert(row.host_id.clone().unwrap());
        }
        assert_eq!(
            landed,
            HashSet::from([a.id.clone(), b.id.clone()]),
            "round {round}: one instance on each free host"
        );
    }
    // Every live row is on its own host, and no attempt was left half-made.
    let live: Vec<_> = w
        .all_vms()
        .await
        .into_iter()
        .filter(|v| v.deleted_at.is_none() && v.creation_failed_at.is_none())
        .collect();
    assert_eq!(live.len(), 12);
    let hosts: HashSet<_> = live.iter().map(|v| v.host_id.clone()).collect();
    assert_eq!(hosts.len(), 12);
}

with_world!(e1_two_creates_racing_for_two_free_hosts_both_land_on_different_hosts,);
