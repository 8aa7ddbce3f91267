//! Break glass past the list's expiry (M; issue #39, 5), the pure half: who may come in, the
//! lines a host writes, what a certificate is asked for and what it must say when it comes
//! back. The real sshd behind the relay is `byo-relay`'s `ssh_path.rs`; `ssh-keygen` itself
//! is the CLI's `keys.rs`.

use byo_core::break_glass::{
    self, BACKDATE_MINUTES, MAX_MINUTES, RELAY_TUNNEL_ADDRESS, Refusal, Request, Trust,
};
use byo_core::keylist_testing as testing;
use chrono::{DateTime, Duration, Utc};
use ssh_key::certificate::{Builder, CertType};
use ssh_key::rand_core::OsRng;
use ssh_key::{Certificate, PrivateKey, PublicKey};

fn now() -> DateTime<Utc> {
    "2026-12-07T12:00:00Z".parse().unwrap()
}

fn request() -> Request {
    Request {
        hosts: vec!["spark-7".into(), "spark-12".into()],
        operator: "op@enverge.ai".into(),
        minutes: 15,
        serial: 7311,
    }
}

/// A certificate as `ssh-keygen -s` writes it for `request`, with `change` applied to the
/// builder's inputs first: how each refusal below is made from one good certificate.
struct Made {
    cert_type: CertType,
    principals: Vec<String>,
    key_id: String,
    serial: u64,
    source: Option<String>,
    after: DateTime<Utc>,
    before: DateTime<Utc>,
}

impl Made {
    fn asked(r: &Request) -> Self {
        Made {
            cert_type: CertType::User,
            principals: r.hosts.clone(),
            key_id: r.key_id(),
            serial: r.serial,
            source: Some(format!("{RELAY_TUNNEL_ADDRESS}/32")),
            after: now() - Duration::minutes(i64::from(BACKDATE_MINUTES)),
            before: now() + Duration::minutes(i64::from(r.minutes)),
        }
    }

    fn sign(&self, subject: &PublicKey, signer: &PrivateKey) -> Certificate {
        let mut b = Builder::new_with_random_nonce(
            &mut OsRng,
            subject.key_data().clone(),
            self.after.timestamp() as u64,
            self.before.timestamp() as u64,
        )
        .unwrap();
        b.cert_type(self.cert_type).unwrap();
        b.serial(self.serial).unwrap();
        b.key_id(&self.key_id).unwrap();
        for p in &self.principals {
            b.valid_principal(p).unwrap();
        }
        if let Some(source) = &self.source {
            b.critical_option("source-address", source).unwrap();
        }
        b.extension("permit-pty", "").unwrap();
        b.sign(signer).unwrap()
    }
}

#[test]
fn m_a_host_principal_is_a_slug_and_nothing_that_could_close_the_quotes() {
    for good in ["spark-7", "a", "0", &"s".repeat(63)] {
        assert!(break_glass::is_host_principal(good), "{good:?}");
    }
    for bad in [
        "",
        &"s".repeat(64),
        "Spark-7",
        "spark_7",
        "-spark",
        "spark 7",
        "spark\"7",
        "spark,7",
        "spark-7\n",
    ] {
        assert!(!break_glass::is_host_principal(bad), "{bad:?}");
    }
}

#[test]
fn m_the_lines_admit_each_signer_for_this_host_from_the_relay_only() {
    let signers = [
        testing::private_key().public_key().clone(),
        testing::private_key().public_key().clone(),
    ];
    let lines = break_glass::authorized_lines(Trust {
        host: "spark-7",
        signers: &signers,
    });
    let keys: Vec<&str> = lines.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(keys.len(), 2, "{lines}");
    for (line, signer) in keys.iter().zip(&signers) {
        let key = signer.to_openssh().unwrap();
        assert_eq!(
            *line,
            format!(
                "cert-authority,principals=\"spark-7\",from=\"10.8.0.1\" {key} byo-break-glass"
            ),
        );
    }
    // A name that does not read as a slug writes nothing at all.
    assert_eq!(
        break_glass::authorized_lines(Trust {
            host: "spark-7\",from=\"*",
            signers: &signers,
        }),
        ""
    );
}

#[test]
fn m_the_held_list_admits_break_glass_only_once_it_has_expired() {
    let list = testing::list("prod", 3, vec![testing::login_key("op-1", "laptop")], now());
    let signer = testing::private_key().public_key().clone();
    let signers = [signer];
    let trust = Trust {
        host: "spark-7",
        signers: &signers,
    };
    let plain = list.authorized_keys();
    let before = list.expires - Duration::seconds(1);
    assert_eq!(list.authorized_keys_at(before, Some(trust)), plain);
    assert_eq!(list.authorized_keys_at(list.expires, None), plain);
    let at = list.authorized_keys_at(list.expires, Some(trust));
    assert!(at.starts_with(&plain), "{at}");
    assert_eq!(
        at.strip_prefix(&plain).unwrap(),
        break_glass::authorized_lines(trust)
    );
    assert!(at.contains("cert-authority,principals=\"spark-7\""), "{at}");
}

#[test]
fn m_a_request_is_refused_before_anything_is_signed() {
    assert_eq!(request().check(), Ok(()));
    let with = |f: &dyn Fn(&mut Request)| {
        let mut r = request();
        f(&mut r);
        r.check()
    };
    assert_eq!(with(&|r| r.hosts.clear()), Err(Refusal::NoHost));
    assert_eq!(
        with(&|r| r.hosts.push("Spark-9".into())),
        Err(Refusal::BadHost("Spark-9".into()))
    );
    assert_eq!(with(&|r| r.minutes = 0), Err(Refusal::BadDuration(0)));
    assert_eq!(
        with(&|r| r.minutes = MAX_MINUTES + 1),
        Err(Refusal::BadDuration(MAX_MINUTES + 1))
    );
    assert_eq!(with(&|r| r.minutes = MAX_MINUTES), Ok(()));
    assert_eq!(with(&|r| r.minutes = 1), Ok(()));
    assert_eq!(with(&|r| r.operator.clear()), Err(Refusal::BadOperator));
    assert_eq!(with(&|r| r.operator = "o".repeat(64)), Ok(()));
    assert_eq!(
        with(&|r| r.operator = "o".repeat(65)),
        Err(Refusal::BadOperator)
    );
    assert_eq!(
        with(&|r| r.operator = "an operator".into()),
        Err(Refusal::BadOperator)
    );
    assert_eq!(
        with(&|r| r.operator = "op\u{1b}[2J".into()),
        Err(Refusal::BadOperator)
    );
    // Each refusal says what to do in words.
    assert!(Refusal::NoHost.to_string().contains("--host"));
    assert!(
        Refusal::BadDuration(90)
            .to_string()
            .contains("1 to 60 minutes, not 90")
    );
}

#[test]
fn m_ssh_keygen_is_asked_for_exactly_the_request() {
    let r = request();
    assert_eq!(r.key_id(), "break-glass:op@enverge.ai:spark-7,spark-12");
    assert_eq!(
        r.keygen_args(),
        [
            "-I",
            "break-glass:op@enverge.ai:spark-7,spark-12",
            "-n",
            "spark-7,spark-12",
            "-V",
            "-5m:+15m",
            "-z",
            "7311",
            "-O",
            "clear",
            "-O",
            "permit-pty",
            "-O",
            "source-address=10.8.0.1/32",
        ]
    );
}

#[test]
fn m_a_certificate_that_does_not_say_what_was_asked_is_refused() {
    let r = request();
    let subject = testing::private_key().public_key().clone();
    let signer_key = testing::private_key();
    let signer = signer_key.public_key().clone();
    let asked = Made::asked(&r);
    let good = asked.sign(&subject, &signer_key);
    assert_eq!(r.verify(&good, &subject, &signer, now()), Ok(()));

    let refused =
        |cert: &Certificate, subject: &PublicKey, signer: &PublicKey, at, why: &str| match r
            .verify(cert, subject, signer, at)
        {
            Err(Refusal::Mismatch(what)) => assert!(what.contains(why), "{what} / {why}"),
            other => panic!("{why}: {other:?}"),
        };
    let other = testing::private_key();
    refused(
        &good,
        other.public_key(),
        &signer,
        now(),
        "certifies another key",
    );
    refused(
        &good,
        &subject,
        other.public_key(),
        now(),
        "does not verify",
    );
    refused(
        &asked.sign(&subject, &other),
        &subject,
        &signer,
        now(),
        "does not verify",
    );
    // Past its window it no longer verifies now.
    refused(
        &good,
        &subject,
        &signer,
        now() + Duration::minutes(16),
        "does not verify",
    );
    let made = |f: &dyn Fn(&mut Made)| {
        let mut m = Made::asked(&r);
        f(&mut m);
        m.sign(&subject, &signer_key)
    };
    refused(
        &made(&|m| m.cert_type = CertType::Host),
        &subject,
        &signer,
        now(),
        "not a user certificate",
    );
    refused(
        &made(&|m| m.principals.push("spark-8".into())),
        &subject,
        &signer,
        now(),
        "other hosts",
    );
    refused(
        &made(&|m| {
            m.principals.pop();
        }),
        &subject,
        &signer,
        now(),
        "other hosts",
    );
    refused(
        &made(&|m| m.key_id = "break-glass:someone-else:spark-7,spark-12".into()),
        &subject,
        &signer,
        now(),
        "ID or serial",
    );
    refused(
        &made(&|m| m.serial = 1),
        &subject,
        &signer,
        now(),
        "ID or serial",
    );
    refused(
        &made(&|m| m.source = None),
        &subject,
        &signer,
        now(),
        "not bound to the relay",
    );
    refused(
        &made(&|m| m.source = Some("0.0.0.0/0".into())),
        &subject,
        &signer,
        now(),
        "not bound to the relay",
    );
    refused(
        &made(&|m| m.before = now() + Duration::minutes(60)),
        &subject,
        &signer,
        now(),
        "validity",
    );
    refused(
        &made(&|m| m.after = now() - Duration::hours(2)),
        &subject,
        &signer,
        now(),
        "validity",
    );
    // At the edges of what is accepted: a window that started moments ago, and one exactly
    // as long as asked plus the backdating and a minute's slack.
    assert_eq!(
        r.verify(
            &made(&|m| m.after = now() - Duration::seconds(30)),
            &subject,
            &signer,
            now()
        ),
        Ok(())
    );
    let longest = Duration::minutes(i64::from(r.minutes + BACKDATE_MINUTES) + 1);
    let edge = |extra: i64| made(&|m| m.before = m.after + longest + Duration::seconds(extra));
    assert_eq!(r.verify(&edge(0), &subject, &signer, now()), Ok(()));
    refused(&edge(1), &subject, &signer, now(), "validity");
    // The principals in another order are the same hosts.
    assert_eq!(
        r.verify(&made(&|m| m.principals.reverse()), &subject, &signer, now()),
        Ok(())
    );
}
