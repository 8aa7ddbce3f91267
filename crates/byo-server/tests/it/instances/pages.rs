//! The customer's instances page, and the helpers that read pages.

use crate::instances::world::*;
use crate::with_world;

/// The text of the first `<p class="{class}" …>` on a page, unescaped.
pub(crate) fn paragraph(page: &str, class: &str) -> Option<String> {
    let start = page.find(&format!("<p class=\"{class}\""))?;
    let rest = &page[start..];
    let text = &rest[rest.find('>')? + 1..rest.find("</p>")?];
    Some(
        text.replace("&quot;", "\"")
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&amp;", "&"),
    )
}

pub(crate) fn alert(page: &str) -> Option<String> {
    paragraph(page, "error")
}

pub(crate) fn notice(page: &str) -> Option<String> {
    paragraph(page, "notice")
}

/// The table row with this id (`instance-…`, `stuck-…`), or None.
pub(crate) fn row<'a>(page: &'a str, id: &str) -> Option<&'a str> {
    let start = page.find(&format!("<tr id=\"{id}\""))?;
    let rest = &page[start..];
    Some(&rest[..rest.find("</tr>")?])
}

pub(crate) fn location(r: &Reply) -> String {
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    r.headers[header::LOCATION].to_str().unwrap().to_owned()
}

impl World {
    pub(crate) async fn create_on_page(&self, user: &User, gpu_type: &str, key: &str) -> Reply {
        user.post_form("/instances", &[("gpu_type", gpu_type), ("ssh_key_id", key)])
            .await
    }

    /// Nothing live, nothing contacted since `calls` create calls, no new audit entry.
    pub(crate) async fn nothing_created(&self, calls: usize, audits: usize) {
        assert!(
            self.all_vms()
                .await
                .iter()
                .all(|v| v.creation_failed_at.is_some() || v.deleted_at.is_some()),
            "nothing live"
        );
        assert_eq!(self.agents.calls(Op::Create).len(), calls, "no host asked");
        assert_eq!(self.audits("vm.create").await.len(), audits);
    }
}

/// The customer's page: every refusal (a bad or duplicate key, no key, someone else's key,
/// no free host, a host that never answers or refuses, someone else's instance) comes back
/// as the API's own message on the page, with the API's status, and changes nothing; an
/// accepted create shows the exact ssh command; the delete has a confirmation step that
/// changes nothing, and a delete the host does not confirm shows as deleting, not gone.
async fn pages_show_each_refusal_in_place_and_change_nothing(w: World) {
    let page = w.customer.page("/instances").await;
    for kind in ["spark-1", "spark-2", "spark-4"] {
        assert!(
            page.contains(&format!("<option value=\"{kind}\"")),
            "{kind}"
        );
    }
    assert!(!page.contains("linux-test"), "staff only");
    assert!(page.contains("Add an SSH key first"));
    let staff = w.op.page("/instances").await;
    assert!(staff.contains("<option value=\"linux-test\""));
    let home = w.customer.page("/").await;
    assert!(home.contains("href=\"/instances\""), "linked from home");

    // No key yet: refused on the page; no row, no host asked.
    let host = w.host("spark-1", Spec::default()).await;
    let r = w.create_on_page(&w.customer, "spark-1", "").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no SSH key with that id")
    );
    assert!(r.text().contains("<h1>Your instances</h1>"), "on the page");
    w.nothing_created(0, 0).await;

    // Keys: a bad one is refused with the reason, and what was typed is kept.
    let r = w
        .customer
        .post_form(
            "/instances/ssh-keys",
            &[
                ("name", "laptop"),
                ("public_key", "ssh-ed25519 AAAAnotbase64"),
            ],
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
    assert!(
        alert(&r.text())
            .unwrap()
            .starts_with("that is not an OpenSSH public key"),
        "{}",
        r.text()
    );
    assert!(r.text().contains(">ssh-ed25519 AAAAnotbase64</textarea>"));
    assert!(
        w.db()
            .ssh_keys_of(&w.customer.sub)
            .await
            .unwrap()
            .is_empty()
    );
    let line = format!("{} me@laptop", public_key_line());
    let r = w
        .customer
        .post_form(
            "/instances/ssh-keys",
            &[("name", "laptop"), ("public_key", &line)],
        )
        .await;
    assert_eq!(location(&r), "/instances");
    let keys = w.db().ssh_keys_of(&w.customer.sub).await.unwrap();
    assert_eq!(keys.len(), 1);
    let key = &keys[0];
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("key-{}", key.id)).expect("the key is listed");
    assert!(listed.contains("laptop") && listed.contains(&key.fingerprint));
    assert!(!page.contains("Add an SSH key first"));
    // The same key again: refused, still one.
    let r = w
        .customer
        .post_form(
            "/instances/ssh-keys",
            &[("name", "again"), ("public_key", &line)],
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert!(
        alert(&r.text())
            .unwrap()
            .starts_with("you already have this key")
    );
    // Someone else removing it: told there is no such key; it stays.
    let r = w
        .other
        .post_form(&format!("/instances/ssh-keys/{}/remove", key.id), &[])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no SSH key with that id")
    );
    assert_eq!(w.db().ssh_keys_of(&w.customer.sub).await.unwrap().len(), 1);

    // Someone else's key answers like no key.
    let theirs = w.add_key(&w.other).await;
    let r = w.create_on_page(&w.customer, "spark-1", &theirs).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no SSH key with that id")
    );
    w.nothing_created(0, 0).await;

    // No free host of that kind: queued (E2), shown with its place and a Cancel button.
    let r = w.create_on_page(&w.customer, "spark-2", &key.id).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.text());
    let to = location(&r);
    let queued = to
        .strip_prefix("/instances?done=queued&id=")
        .unwrap()
        .to_owned();
    // Issue #42, 5: the page says what happened at the top and marks the row; it does not
    // send the browser down to the row (no fragment).
    let page = w.customer.page(&to).await;
    let listed = row(&page, &format!("queued-{queued}")).unwrap().to_owned();
    assert!(
        listed.contains("spark-2") && listed.contains("Cancel"),
        "{listed}"
    );
    assert!(
        page.contains(&format!(r#"<tr id="queued-{queued}" class="done">"#)),
        "{page}"
    );
    assert!(
        page.contains("No spark-2 host is free, so your create is queued (place 1 in line)"),
        "{page}"
    );
    let plain = w.customer.page("/instances").await;
    assert!(
        !plain.contains(r#"class="done""#) && !plain.contains(r#"id="done""#),
        "{plain}"
    );
    w.nothing_created(0, 0).await;
    let r = w
        .customer
        .post_form(&format!("/instances/queue/{queued}/cancel"), &[])
        .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert!(
        !w.customer
            .page("/instances")
            .await
            .contains(&format!("queued-{queued}"))
    );

    // A host that never answers, or refuses: its reason, nothing live, the host free.
    for (n, (answer, status, reason)) in [
        (
            Answer::Unreachable,
            StatusCode::GATEWAY_TIMEOUT,
            "the host did not answer; the instance was not created",
        ),
        (
            Answer::Refuse,
            StatusCode::BAD_GATEWAY,
            "the host refused the instance: the host could not carry it out;",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        w.answer_creates(answer);
        let r = w.create_on_page(&w.customer, "spark-1", &key.id).await;
        assert_eq!(r.status, status, "{answer:?}: {}", r.text());
        let shown = alert(&r.text()).unwrap();
        assert!(
            shown.starts_with(reason) && shown.ends_with("nothing is billed"),
            "{answer:?}: {shown}"
        );
        // Issue #36, 8: never the agent's own text nor the connection's error.
        assert!(
            !shown.contains("connection refused") && !shown.contains("SSH map"),
            "{answer:?}: {shown}"
        );
        w.nothing_created(n + 1, n + 1).await;
        assert!(w.pickable(&host.id).await, "{answer:?}: the host is free");
        let failed = w.agents.calls(Op::Create).pop().unwrap();
        let failed = w
            .all_vms()
            .await
            .into_iter()
            .find(|v| v.name == failed.name);
        let failed = failed.unwrap();
        let listed = row(&r.text(), &format!("instance-{}", failed.id))
            .unwrap()
            .to_owned();
        assert!(listed.contains("failed: never created, not billed"));
        assert!(!listed.contains("root@") && !listed.contains("/delete"));
    }

    // Silence: the host may still be making it, so the page says it stays "creating" until
    // the host's heartbeat settles it; settled failed, it shows as never created.
    w.answer_creates(Answer::Hang);
    let r = w.create_on_page(&w.customer, "spark-1", &key.id).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT, "{}", r.text());
    let shown = alert(&r.text()).unwrap();
    assert!(
        shown.starts_with("the host did not answer in time")
            && shown.ends_with("failed and never billed if not"),
        "{shown}"
    );
    let silent = w.agents.calls(Op::Create).pop().unwrap();
    let silent = w
        .all_vms()
        .await
        .into_iter()
        .find(|v| v.name == silent.name)
        .unwrap();
    let listed = row(&r.text(), &format!("instance-{}", silent.id))
        .unwrap()
        .to_owned();
    assert!(
        listed.contains("<td class=\"status\">creating</td>"),
        "{listed}"
    );
    w.clock.advance(TimeDelta::seconds(1));
    assert_eq!(w.beat(&host, &[]).await, StatusCode::NO_CONTENT);
    w.nothing_created(3, 3).await;
    assert!(w.pickable(&host.id).await);

    // Accepted: back to the list, which shows the exact command.
    w.answer_creates(Answer::Ok);
    let r = w.create_on_page(&w.customer, "spark-1", &key.id).await;
    let to = location(&r);
    let id = to
        .strip_prefix("/instances?done=created&id=")
        .unwrap()
        .to_owned();
    let said = w.customer.page(&to).await;
    assert!(
        said.contains(" is created. Connect with the ssh line in its row"),
        "{said}"
    );
    let vm = w.vm(&id).await;
    assert_eq!(vm.status, VmStatus::Running);
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("instance-{id}")).unwrap();
    // No DNS is published here (local tunnels): the command is the relay's address, under
    // the instance's own host-key name.
    let command = format!("ssh -o HostKeyAlias=byo-{id} root@10.8.0.1");
    assert!(
        listed.contains(&format!("<code id=\"ssh-{id}\">{command}</code>")),
        "{listed}"
    );
    assert!(listed.contains(&format!("data-copy=\"ssh-{id}\"")));
    assert!(listed.contains("<td class=\"status\">running</td>"));
    assert!(listed.contains(&format!("href=\"/instances/{id}/delete\"")));

    // The confirmation step asks, and changes nothing.
    let confirm = w.customer.page(&format!("/instances/{id}/delete")).await;
    assert!(confirm.contains(&format!("action=\"/instances/{id}/delete\"")));
    assert!(confirm.contains(&format!("Yes, delete {}", vm.name)));
    assert_eq!(w.vm(&id).await.delete_requested_at, None);
    // Someone else's instance: not found, on both steps; nothing changes.
    let r = w.other.get(&format!("/instances/{id}/delete")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let r = w
        .other
        .post_form(&format!("/instances/{id}/delete"), &[])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        alert(&r.text()).as_deref(),
        Some("you have no instance with that id")
    );
    assert_eq!(w.vm(&id).await.delete_requested_at, None);
    assert!(w.agents.calls(Op::Delete).is_empty());

    // The host does not confirm in time: deleting, not gone, and the API's 202.
    w.answer_deletes(Answer::Hang);
    w.clock.advance(TimeDelta::minutes(3));
    let requested = w.clock.now();
    let r = w
        .customer
        .post_form(&format!("/instances/{id}/delete"), &[])
        .await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "{}", r.text());
    assert!(
        notice(&r.text())
            .unwrap()
            .contains("the host has not confirmed it (no answer within 0 s)"),
        "{}",
        r.text()
    );
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("instance-{id}")).unwrap();
    assert!(
        listed.contains("<td class=\"status\">deleting: waiting for the host to confirm</td>"),
        "{listed}"
    );
    assert!(listed.contains("Delete again"));
    let row_now = w.vm(&id).await;
    assert_eq!(
        (row_now.delete_requested_at, row_now.deleted_at),
        (Some(requested), None)
    );
    assert!(!w.pickable(&host.id).await, "still held");

    // Asked again, confirmed: gone, with its time, and the first request kept.
    w.answer_deletes(Answer::Ok);
    w.clock.advance(TimeDelta::minutes(1));
    let r = w
        .customer
        .post_form(&format!("/instances/{id}/delete"), &[])
        .await;
    assert_eq!(location(&r), format!("/instances?done=deleted&id={id}"));
    let said = w.customer.page(&location(&r)).await;
    assert!(said.contains(" is deleted: its host confirmed"), "{said}");
    let closed = w.vm(&id).await;
    assert_eq!(
        (closed.delete_requested_at, closed.deleted_at),
        (Some(requested), Some(w.clock.now()))
    );
    let page = w.customer.page("/instances").await;
    let listed = row(&page, &format!("instance-{id}")).unwrap();
    assert!(listed.contains("<td class=\"status\">deleted</td>"));
    let deleted_at = w
        .clock
        .now()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    assert!(listed.contains(&format!("<time datetime=\"{deleted_at}\">")));
    assert!(!listed.contains("root@") && !listed.contains("/delete\""));

    // The key goes; the page says there are none.
    let r = w
        .customer
        .post_form(&format!("/instances/ssh-keys/{}/remove", key.id), &[])
        .await;
    assert_eq!(location(&r), "/instances");
    assert!(
        w.db()
            .ssh_keys_of(&w.customer.sub)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        w.customer
            .page("/instances")
            .await
            .contains("Add an SSH key first")
    );
}

/// A tunnel provider whose SSH wildcard is real DNS, as Cloudflare's is.
struct PublishedDns(byo_server::providers::local::LocalTunnels);

impl byo_server::providers::TunnelProvider for PublishedDns {
    fn create<'a>(
        &'a self,
        slug: &'a str,
    ) -> BoxFuture<
        'a,
        Result<byo_server::providers::TunnelInfo, byo_server::providers::ProviderError>,
    > {
        self.0.create(slug)
    }
    fn delete<'a>(
        &'a self,
        slug: &'a str,
    ) -> BoxFuture<'a, Result<(), byo_server::providers::ProviderError>> {
        self.0.delete(slug)
    }
    fn point_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
        address: &'a str,
    ) -> BoxFuture<'a, Result<(), byo_server::providers::ProviderError>> {
        self.0.point_ssh_wildcard(name, address)
    }
    fn remove_ssh_wildcard<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<(), byo_server::providers::ProviderError>> {
        self.0.remove_ssh_wildcard(name)
    }
    fn publishes_dns(&self) -> bool {
        true
    }
}

/// The connect line works where it is shown: where no DNS is published (`byo up`'s local
/// tunnels) it is the relay's address, which the machine running byo up reaches; where the
/// wildcard is real DNS it is the instance's name. The row shows the relay either way.
async fn e1_the_connect_line_works_where_it_is_shown(mut w: World) {
    w.host("spark-1", Spec::default()).await;
    let key = w.add_key(&w.customer).await;
    let r = w.create(&w.customer, "spark-1", &key).await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let body = r.json();
    let hostname = body["instance"]["ssh_hostname"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(body["instance"]["relay_address"], "10.8.0.1");
    let first = body["instance"]["id"].as_str().unwrap().to_owned();
    let line = format!("ssh -o HostKeyAlias=byo-{first} root@10.8.0.1");
    assert_eq!(body["instance"]["ssh_command"], line.as_str());
    let page = w.customer.page("/instances").await;
    assert!(page.contains("<code id=\"ssh-"), "{page}");
    assert!(page.contains(&format!(">{line}</code>")), "{page}");
    assert!(page.contains("relay 10.8.0.1"), "{page}");
    assert!(!page.contains(&format!("ssh root@{hostname}")), "{page}");

    let relays = w.app.state.relays.clone();
    let dns = Arc::new(PublishedDns(Default::default()));
    let state = w.app.state.clone().with_providers(relays, dns);
    w.app.router = byo_server::router(state);
    let listed = w
        .app
        .get("/api/vms", Some(&w.customer.session))
        .await
        .json();
    assert_eq!(listed[0]["ssh_command"], format!("ssh root@{hostname}"));
    let page = w
        .app
        .get("/instances", Some(&w.customer.session))
        .await
        .text();
    assert!(
        page.contains(&format!(">ssh root@{hostname}</code>")),
        "{page}"
    );
}

/// Issue #42, 1: before a create is sent, the form says for each GPU kind what it would meet —
/// how many hosts are free now, none free (it would queue), or none at all (it would queue
/// until one is added) — and starts on a kind a create would land on.
async fn e1_the_create_form_says_what_each_kind_would_meet_before_it_is_sent(w: World) {
    /// The `<option>` for `kind`, its text included.
    fn option(page: &str, kind: &str) -> String {
        let start = page
            .find(&format!("<option value=\"{kind}\""))
            .unwrap_or_else(|| panic!("{kind}: {page}"));
        let rest = &page[start..];
        rest[..rest.find("</option>").unwrap()].to_owned()
    }
    let page = w.customer.page("/instances").await;
    let spark1 = option(&page, "spark-1");
    assert!(
        spark1.contains("no host of this kind yet: a create waits in the queue"),
        "{spark1}"
    );
    assert!(
        !page.contains("selected"),
        "no kind would land: none is preselected"
    );

    w.host("spark-1", Spec::default()).await;
    let page = w.customer.page("/instances").await;
    let spark1 = option(&page, "spark-1");
    assert!(spark1.contains("1 free now"), "{spark1}");
    assert!(
        spark1.contains(" selected"),
        "the kind with a free host is the default: {spark1}"
    );
    assert!(option(&page, "spark-2").contains("no host of this kind yet"));

    w.running().await;
    let page = w.customer.page("/instances").await;
    let spark1 = option(&page, "spark-1");
    assert!(
        spark1.contains("none free now: a create waits in the queue"),
        "{spark1}"
    );
    assert!(!spark1.contains(" selected"), "{spark1}");
}

with_world!(
    e1_the_create_form_says_what_each_kind_would_meet_before_it_is_sent,
    pages_show_each_refusal_in_place_and_change_nothing,
    e1_the_connect_line_works_where_it_is_shown,
);
