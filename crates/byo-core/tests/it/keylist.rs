//! The operator-key list verifier (M): every refusal, and interoperability both ways with
//! `ssh-keygen -Y sign` / `-Y verify`.

use std::process::Command;

use byo_core::keylist::{self, Held, KeyList, NAMESPACE, OperatorKey, Refusal, SignedList, verify};
use byo_core::keylist_testing as testing;
use chrono::{DateTime, Utc};
use ssh_key::{HashAlg, LineEnding, PrivateKey, PublicKey, SshSig};

fn now() -> DateTime<Utc> {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn signing_key() -> PrivateKey {
    testing::private_key()
}

fn login_key(label: &str) -> OperatorKey {
    testing::login_key("op-1", label)
}

fn list(version: u64, keys: Vec<OperatorKey>) -> KeyList {
    testing::list("prod", version, keys, now())
}

use testing::{envelope, sign};

fn check(bytes: &[u8], trusted: &PrivateKey, held: Option<&Held>) -> Result<KeyList, Refusal> {
    verify(bytes, &[trusted.public_key().clone()], "prod", held, now()).map(|v| v.list)
}

#[test]
fn a_list_signed_by_the_pinned_key_is_accepted() {
    let sk = signing_key();
    let l = list(3, vec![login_key("laptop"), login_key("desktop")]);
    let got = check(&envelope(&l, &[&sk]), &sk, None).unwrap();
    let mut sorted = l.clone();
    sorted.keys.sort();
    assert_eq!(got, sorted);
    // The same version with the same keys is taken again (sending again after a lost answer).
    assert!(check(&envelope(&l, &[&sk]), &sk, Some(&Held::from(&l))).is_ok());
}

#[test]
fn replays_are_refused() {
    let sk = signing_key();
    let a = login_key("a");
    let held_list = list(5, vec![a.clone()]);
    let held = Held::from(&held_list);
    let older = list(4, vec![a.clone(), login_key("removed since")]);
    assert_eq!(
        check(&envelope(&older, &[&sk]), &sk, Some(&held)),
        Err(Refusal::OlderVersion {
            held: 5,
            offered: 4
        })
    );
    let same_version_other_keys = list(5, vec![login_key("b")]);
    assert_eq!(
        check(
            &envelope(&same_version_other_keys, &[&sk]),
            &sk,
            Some(&held)
        ),
        Err(Refusal::SameVersionDifferentKeys { version: 5 })
    );
    assert!(check(&envelope(&list(6, vec![a]), &[&sk]), &sk, Some(&held)).is_ok());
}

#[test]
fn signatures_must_come_from_the_pinned_key_in_our_namespace() {
    let sk = signing_key();
    let stranger = signing_key();
    let l = list(1, vec![login_key("a")]);
    assert_eq!(
        check(&envelope(&l, &[&stranger]), &sk, None),
        Err(Refusal::BadSignature {
            valid: 0,
            threshold: 1
        })
    );
    assert_eq!(
        check(&envelope(&l, &[]), &sk, None),
        Err(Refusal::BadSignature {
            valid: 0,
            threshold: 1
        })
    );
    let body = l.to_canonical();
    let other_ns = SshSig::sign(&sk, "file", HashAlg::Sha512, body.as_bytes()).unwrap();
    let bytes = SignedList {
        body: body.clone(),
        signatures: vec![other_ns.to_pem(LineEnding::LF).unwrap()],
    }
    .to_bytes();
    assert!(matches!(
        check(&bytes, &sk, None),
        Err(Refusal::BadSignature { .. })
    ));
    // A signature over other bytes does not carry over.
    let mut tampered = l.clone();
    tampered.keys.push(login_key("smuggled"));
    let bytes = SignedList {
        body: tampered.to_canonical(),
        signatures: vec![sign(&body, &sk)],
    }
    .to_bytes();
    assert!(matches!(
        check(&bytes, &sk, None),
        Err(Refusal::BadSignature { .. })
    ));
    // A host that trusts no key refuses everything.
    assert_eq!(
        verify(&envelope(&l, &[&sk]), &[], "prod", None, now()).unwrap_err(),
        Refusal::NoTrustedKey
    );
}

#[test]
fn a_duplicated_signature_counts_once() {
    let sk = signing_key();
    let second = signing_key();
    let mut l = list(1, vec![login_key("a")]);
    l.threshold = 2;
    let trusted = [sk.public_key().clone(), second.public_key().clone()];
    let twice = envelope(&l, &[&sk, &sk]);
    assert_eq!(
        verify(&twice, &trusted, "prod", None, now()).unwrap_err(),
        Refusal::BadSignature {
            valid: 1,
            threshold: 2
        }
    );
    assert!(
        verify(
            &envelope(&l, &[&sk, &second]),
            &trusted,
            "prod",
            None,
            now()
        )
        .is_ok()
    );
}

#[test]
fn bad_lists_are_refused_even_when_signed() {
    let sk = signing_key();
    let refuse = |l: KeyList| check(&envelope(&l, &[&sk]), &sk, None).unwrap_err();

    assert_eq!(refuse(list(1, vec![])), Refusal::Empty);
    let mut expired = list(1, vec![login_key("a")]);
    expired.expires = now();
    assert!(matches!(refuse(expired), Refusal::Expired { .. }));
    let mut kind = list(1, vec![login_key("a")]);
    kind.kind = "something-else".into();
    assert_eq!(refuse(kind), Refusal::WrongKind);
    let mut env = list(1, vec![login_key("a")]);
    env.environment = "staging".into();
    assert!(matches!(refuse(env), Refusal::WrongEnvironment { .. }));

    let a = login_key("a");
    let mut dup = a.clone();
    dup.label = "same key, other label".into();
    assert!(matches!(
        refuse(list(1, vec![a.clone(), dup])),
        Refusal::DuplicateKey(_)
    ));

    let mut options = login_key("a");
    options.public_key = format!("command=\"/bin/sh\" {}", options.public_key);
    assert!(matches!(
        refuse(list(1, vec![options])),
        Refusal::KeyOptions(_)
    ));
    let mut comment = login_key("a");
    comment.public_key.push_str(" me@laptop");
    assert!(matches!(
        refuse(list(1, vec![comment])),
        Refusal::KeyOptions(_)
    ));
    let mut rsa = login_key("a");
    rsa.public_key = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7".into();
    assert_eq!(
        refuse(list(1, vec![rsa])),
        Refusal::DisallowedKeyType("ssh-rsa".into())
    );
    let mut control = login_key("a");
    control.label = "laptop\u{1b}[2J".into();
    assert!(matches!(
        refuse(list(1, vec![control])),
        Refusal::ControlCharacters(_)
    ));
}

/// `MAX_KEYS` (256) is the bound: a signed list of 256 keys verifies, one of 257 is
/// refused as too many (not as oversized: its envelope is well within the byte bound).
#[test]
fn a_list_holds_at_most_256_keys() {
    let sk = signing_key();
    let mut full = list(1, vec![]);
    full.keys = (0..keylist::MAX_KEYS)
        .map(|i| login_key(&format!("machine {i}")))
        .collect();
    assert_eq!(full.keys.len(), 256);
    let verified = check(&envelope(&full, &[&sk]), &sk, None).unwrap();
    assert_eq!(verified.keys.len(), 256);
    let mut over = full.clone();
    over.keys.push(login_key("one more"));
    let bytes = envelope(&over, &[&sk]);
    assert!(bytes.len() < keylist::MAX_ENVELOPE_BYTES);
    assert_eq!(check(&bytes, &sk, None), Err(Refusal::TooManyKeys));
    assert_eq!(over.check().unwrap_err(), Refusal::TooManyKeys);
}

#[test]
fn oversized_and_non_canonical_bytes_are_refused() {
    let sk = signing_key();
    let huge = vec![b' '; keylist::MAX_ENVELOPE_BYTES + 1];
    assert_eq!(check(&huge, &sk, None), Err(Refusal::Oversized));
    let l = list(1, vec![login_key("a")]);
    let spaced = l.to_canonical().replacen(",", ", ", 1);
    let bytes = SignedList {
        signatures: vec![sign(&spaced, &sk)],
        body: spaced,
    }
    .to_bytes();
    assert_eq!(check(&bytes, &sk, None), Err(Refusal::NotCanonical));
    let mut many = list(1, vec![]);
    many.keys = (0..600)
        .map(|i| login_key(&format!("machine {i}")))
        .collect();
    assert!(matches!(
        check(&envelope(&many, &[&sk]), &sk, None),
        Err(Refusal::Oversized)
    ));
    assert!(matches!(
        check(b"{not json", &sk, None),
        Err(Refusal::Malformed(_))
    ));
}

fn ssh_keygen_available() -> bool {
    byo_core::testing::have_tools(&["ssh-keygen"])
}

#[test]
fn lists_signed_by_ssh_keygen_verify_and_ours_verify_with_ssh_keygen() {
    if !ssh_keygen_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key_path = dir.path().join("signing");
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "signing", "-f"])
        .arg(&key_path)
        .status()
        .unwrap();
    assert!(st.success());
    let l = list(2, vec![login_key("laptop")]);
    let body = l.to_canonical();
    let body_path = dir.path().join("list.json");
    std::fs::write(&body_path, &body).unwrap();

    // ssh-keygen signs; our verifier accepts.
    let st = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
        .arg(&key_path)
        .arg(&body_path)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    let theirs = std::fs::read_to_string(dir.path().join("list.json.sig")).unwrap();
    let public = PublicKey::read_openssh_file(&key_path.with_extension("pub")).unwrap();
    let bytes = SignedList {
        body: body.clone(),
        signatures: vec![theirs],
    }
    .to_bytes();
    assert!(verify(&bytes, std::slice::from_ref(&public), "prod", None, now()).is_ok());

    // We sign; ssh-keygen verifies.
    let private = PrivateKey::read_openssh_file(&key_path).unwrap();
    let ours = sign(&body, &private);
    let sig_path = dir.path().join("ours.sig");
    std::fs::write(&sig_path, ours).unwrap();
    let signers = dir.path().join("allowed_signers");
    std::fs::write(
        &signers,
        format!("signer@byo {}\n", public.to_openssh().unwrap()),
    )
    .unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-Y", "verify", "-n", NAMESPACE, "-I", "signer@byo", "-f"])
        .arg(&signers)
        .arg("-s")
        .arg(&sig_path)
        .stdin(std::fs::File::open(&body_path).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn authorized_keys_carries_expiry_and_attribution_and_parses_with_ssh_keygen() {
    let l = list(7, vec![login_key("work laptop"), login_key("desktop")]);
    let text = l.authorized_keys();
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert!(
            line.starts_with("expiry-time=\"20270227120000Z\" ssh-ed25519 "),
            "{line}"
        );
        assert!(line.contains(" byo-operator:op-1:"), "{line}");
    }
    if !ssh_keygen_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("authorized_keys");
    std::fs::write(&path, &text).unwrap();
    let out = Command::new("ssh-keygen")
        .arg("-l")
        .arg("-f")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8(out.stdout).unwrap();
    for k in &l.keys {
        let fp = keylist::check_key(k).unwrap().fingerprint;
        assert!(listed.contains(&fp), "ssh-keygen lists {fp}: {listed}");
    }
}

fn bare(key: &PrivateKey) -> String {
    let mut public = key.public_key().clone();
    public.set_comment("");
    public.to_openssh().unwrap()
}

/// M.13: a list signed by the pinned key names its successor inside the signed bytes; the
/// holder that applied it trusts the successor and no longer the old key.
#[test]
fn m13_rotation_moves_trust_to_the_successor_only_through_signed_lists() {
    let old = signing_key();
    let new = signing_key();
    let pinned = [old.public_key().clone()];
    let base = list(1, vec![login_key("laptop")]);
    let rotation = KeyList::with_change(
        Some(&base),
        &keylist::Change::RotateSigningKeys {
            successors: vec![format!("{} new-signing-key", bare(&new))],
        },
        "prod",
        2,
        now(),
        chrono::Duration::days(90),
    )
    .unwrap();
    assert_eq!(rotation.next_signing_keys, Some(vec![bare(&new)]));
    // Signed by the pinned key alone: the successor has not shown it exists.
    assert_eq!(
        verify(&envelope(&rotation, &[&old]), &pinned, "prod", None, now()).unwrap_err(),
        Refusal::SuccessorUnproven {
            valid: 0,
            threshold: 1
        }
    );
    // Signed by the successor alone: not trusted yet.
    assert!(matches!(
        verify(&envelope(&rotation, &[&new]), &pinned, "prod", None, now()),
        Err(Refusal::BadSignature { .. })
    ));
    // Both: accepted, and the trust for the next list is the successor's alone.
    let applied = verify(
        &envelope(&rotation, &[&old, &new]),
        &pinned,
        "prod",
        None,
        now(),
    )
    .unwrap()
    .list;
    let next_trust = keylist::trusted_after(&pinned, Some(&applied));
    assert_eq!(next_trust, vec![new.public_key().clone().tap_comment()]);
    // A later change carries the rotation forward; the old key signs nothing any more.
    let later = KeyList::with_change(
        Some(&applied),
        &keylist::Change::Add {
            user_sub: "op-1".into(),
            label: "desktop".into(),
            public_key: testing::public_key_line(),
        },
        "prod",
        3,
        now(),
        chrono::Duration::days(90),
    )
    .unwrap();
    assert_eq!(later.next_signing_keys, applied.next_signing_keys);
    let held = Held::from(&applied);
    assert!(matches!(
        verify(
            &envelope(&later, &[&old]),
            &next_trust,
            "prod",
            Some(&held),
            now()
        ),
        Err(Refusal::BadSignature { .. })
    ));
    assert!(
        verify(
            &envelope(&later, &[&new]),
            &next_trust,
            "prod",
            Some(&held),
            now()
        )
        .is_ok()
    );
    // With nothing held, the pin stands.
    assert_eq!(keylist::trusted_after(&pinned, None), pinned.to_vec());
}

/// A rotation list whose successor is not a bare, allowed key is refused even when signed.
#[test]
fn m13_a_successor_that_is_not_an_allowed_key_is_refused() {
    let old = signing_key();
    let mut l = list(2, vec![login_key("laptop")]);
    l.next_signing_keys = Some(vec!["ssh-ed25519 AAAA not-bare".into()]);
    assert!(matches!(
        check(&envelope(&l, &[&old]), &old, None),
        Err(Refusal::BadSuccessor(_))
    ));
    l.next_signing_keys = Some(vec![]);
    assert!(matches!(
        check(&envelope(&l, &[&old]), &old, None),
        Err(Refusal::BadSuccessor(_))
    ));
}

/// I: leaving is one action — a departing operator's keys all go in one change, and a
/// superadmin's removal does not need to own the key; an operator's own removal still does.
#[test]
fn i_departure_removes_every_key_of_the_operator_and_only_theirs() {
    let mine = testing::login_key("op-1", "laptop");
    let mine2 = testing::login_key("op-1", "desktop");
    let theirs = testing::login_key("op-2", "laptop");
    let base = list(1, vec![mine.clone(), mine2.clone(), theirs.clone()]);
    let make = |c: keylist::Change| {
        KeyList::with_change(
            Some(&base),
            &c,
            "prod",
            2,
            now(),
            chrono::Duration::days(90),
        )
    };
    let departed = make(keylist::Change::Depart {
        user_sub: "op-1".into(),
    })
    .unwrap();
    assert_eq!(departed.keys, vec![theirs.clone()]);
    let fp = keylist::check_key(&theirs).unwrap().fingerprint;
    assert_eq!(
        make(keylist::Change::Remove {
            user_sub: "op-1".into(),
            fingerprint: fp.clone()
        })
        .unwrap_err(),
        keylist::ChangeRefusal::NotYours(fp.clone())
    );
    let removed = make(keylist::Change::RemoveAny { fingerprint: fp }).unwrap();
    assert!(!removed.keys.contains(&theirs) && removed.keys.len() == 2);
    assert!(matches!(
        make(keylist::Change::Depart {
            user_sub: "op-9".into()
        }),
        Err(keylist::ChangeRefusal::NotFound(_))
    ));
}

trait TapComment {
    fn tap_comment(self) -> Self;
}

impl TapComment for PublicKey {
    fn tap_comment(mut self) -> Self {
        self.set_comment("");
        self
    }
}
/// Fields are 1 to 128 printable characters: 128 taken, 129 and empty refused as malformed,
/// a control character refused by name, escaped in the refusal so a terminal showing it is
/// not driven by it.
#[test]
fn fields_are_bounded_and_printable_and_refusals_say_which() {
    let at = |label: String| {
        let mut k = login_key("x");
        k.label = label;
        keylist::check_key(&k)
    };
    assert!(at("l".repeat(128)).is_ok());
    for bad in [String::new(), "l".repeat(129)] {
        assert_eq!(
            at(bad).unwrap_err(),
            Refusal::Malformed("label must be 1 to 128 characters".into())
        );
    }
    let refused = at("laptop\u{1b}[2J".into()).unwrap_err();
    assert_eq!(
        refused,
        Refusal::ControlCharacters(r#"label "laptop\\u{1b}[2J""#.into())
    );
    assert_eq!(
        refused.to_string(),
        r#"label "laptop\\u{1b}[2J" contains control characters"#
    );
    assert_eq!(keylist::escape_control("a\tb\u{7}c é"), r"a\tb\u{7}c é");
    // What an operator reads when a list is refused.
    for (refusal, says) in [
        (Refusal::TooManyKeys, "the list has more than 256 keys"),
        (Refusal::Oversized, "the list is larger than 65536 bytes"),
        (
            Refusal::Empty,
            "the list has no keys; it would lock every operator out",
        ),
        (
            Refusal::BadSignature {
                valid: 0,
                threshold: 1,
            },
            "0 valid signature(s) from trusted keys, 1 needed",
        ),
        (
            Refusal::OlderVersion {
                held: 3,
                offered: 2,
            },
            "version 2 is older than the held version 3",
        ),
    ] {
        assert_eq!(refusal.to_string(), says);
    }
}

/// The body bound is inclusive: a canonical body of exactly `MAX_BODY_BYTES` parses, one
/// byte more is oversized.
#[test]
fn a_body_of_exactly_the_bound_parses() {
    let mut l = list(1, vec![login_key("x")]);
    let base = l.to_canonical().len();
    l.keys[0].label = "x".repeat(keylist::MAX_BODY_BYTES - base + 1);
    let body = l.to_canonical();
    assert_eq!(body.len(), keylist::MAX_BODY_BYTES);
    assert!(KeyList::from_canonical(&body).is_ok());
    l.keys[0].label.push('x');
    assert_eq!(
        KeyList::from_canonical(&l.to_canonical()),
        Err(Refusal::Oversized)
    );
}

/// M.10's pure step: how one change makes the next list, and every refusal, named.
#[test]
fn m10_a_change_makes_the_next_list_or_says_why_not() {
    use keylist::{Change, ChangeRefusal};
    let issued = "2026-11-29T12:00:00.123456789Z"
        .parse::<DateTime<Utc>>()
        .unwrap();
    let validity = chrono::Duration::days(30);
    let (a, b) = (testing::public_key_line(), testing::public_key_line());
    let add = |who: &str, key: &str| Change::Add {
        user_sub: who.into(),
        label: format!("  {who}'s laptop  "),
        public_key: format!(" {key} "),
    };
    let fp = |key: &str| {
        keylist::check_key(&OperatorKey {
            user_sub: "x".into(),
            label: "x".into(),
            public_key: key.into(),
        })
        .unwrap()
        .fingerprint
    };
    let remove = |who: &str, key: &str| Change::Remove {
        user_sub: who.into(),
        fingerprint: fp(key),
    };
    let next = |base: Option<&KeyList>, change: &Change| {
        KeyList::with_change(base, change, "prod", 7, issued, validity)
    };

    let one = next(None, &add("op-1", &a)).unwrap();
    assert_eq!((one.version, one.environment.as_str()), (7, "prod"));
    assert_eq!(
        one.issued_at,
        "2026-11-29T12:00:00Z".parse::<DateTime<Utc>>().unwrap()
    );
    assert_eq!(
        one.expires,
        one.issued_at + validity,
        "valid for `validity` from issue"
    );
    assert_eq!(one.threshold, 1);
    assert_eq!(
        one.keys,
        [OperatorKey {
            user_sub: "op-1".into(),
            label: "op-1's laptop".into(),
            public_key: a.clone()
        }],
        "label and key trimmed"
    );
    // The same key again, whoever adds it: already listed.
    assert_eq!(
        next(Some(&one), &add("op-2", &a)),
        Err(ChangeRefusal::AlreadyListed(fp(&a)))
    );
    let two = next(Some(&one), &add("op-2", &b)).unwrap();
    assert_eq!(two.keys.len(), 2);
    // Removing: only one's own key, only one that is listed, never the last.
    assert_eq!(
        next(Some(&two), &remove("op-2", &a)),
        Err(ChangeRefusal::NotYours(fp(&a)))
    );
    let absent = testing::public_key_line();
    assert_eq!(
        next(Some(&two), &remove("op-1", &absent)),
        Err(ChangeRefusal::NotFound(fp(&absent)))
    );
    let left = next(Some(&two), &remove("op-1", &a)).unwrap();
    assert_eq!(
        left.keys
            .iter()
            .map(|k| k.public_key.as_str())
            .collect::<Vec<_>>(),
        [b.as_str()]
    );
    assert_eq!(
        next(Some(&left), &remove("op-2", &b)),
        Err(ChangeRefusal::NoOperatorLeft)
    );
    assert!(matches!(
        next(None, &add("op-1", "ssh-rsa AAAA")),
        Err(ChangeRefusal::Key(Refusal::DisallowedKeyType(_)))
    ));
    // A base's threshold carries over (never below 1).
    let mut strict = two.clone();
    strict.threshold = 2;
    assert_eq!(
        next(Some(&strict), &remove("op-1", &a)).unwrap().threshold,
        2
    );
    // What an operator reads.
    for (refusal, says) in [
        (
            ChangeRefusal::AlreadyListed("SHA256:x".into()),
            "key SHA256:x is already on the list",
        ),
        (
            ChangeRefusal::NotFound("SHA256:x".into()),
            "key SHA256:x is not on the list",
        ),
        (
            ChangeRefusal::NotYours("SHA256:x".into()),
            "key SHA256:x belongs to another operator",
        ),
        (
            ChangeRefusal::NoOperatorLeft,
            "that would leave no operator key: every host would be unadministrable",
        ),
        (
            ChangeRefusal::Key(Refusal::TooManyKeys),
            "the list has more than 256 keys",
        ),
    ] {
        assert_eq!(refusal.to_string(), says);
    }
}

/// The envelope bound is inclusive: exactly `MAX_ENVELOPE_BYTES` is read, one more is not.
#[test]
fn an_envelope_of_exactly_the_bound_is_read() {
    let mut bytes = SignedList {
        body: String::new(),
        signatures: vec![],
    }
    .to_bytes();
    bytes.resize(keylist::MAX_ENVELOPE_BYTES, b' ');
    assert!(SignedList::from_bytes(&bytes).is_ok());
    bytes.push(b' ');
    assert_eq!(SignedList::from_bytes(&bytes), Err(Refusal::Oversized));
}

/// #16: the warning ladder before a list lapses — nothing beyond 14 days, then 14, 7 and 1,
/// and 0 once expired; each boundary belongs to the nearer step.
#[test]
fn expiry_warnings_step_at_14_7_and_1_days_and_name_an_expired_list() {
    use chrono::Duration;
    let now = now();
    let at = |left: Duration| keylist::expiry_warning(now + left, now);
    assert_eq!(at(Duration::days(30)), None);
    assert_eq!(at(Duration::days(14) + Duration::seconds(1)), None);
    assert_eq!(at(Duration::days(14)), Some(14));
    assert_eq!(at(Duration::days(7) + Duration::seconds(1)), Some(14));
    assert_eq!(at(Duration::days(7)), Some(7));
    assert_eq!(at(Duration::days(2)), Some(7));
    assert_eq!(at(Duration::days(1)), Some(1));
    assert_eq!(at(Duration::seconds(1)), Some(1));
    assert_eq!(at(Duration::zero()), Some(0));
    assert_eq!(at(-Duration::days(3)), Some(0));
}
