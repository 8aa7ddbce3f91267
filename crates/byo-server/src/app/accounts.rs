//! Local accounts: the rules for emails and passwords, signing up and in, changing a
//! password, and the first superadmin.

use std::net::IpAddr;

use axum_extra::extract::cookie::Cookie;
use byo_core::tokens::{SecretToken, TokenKind};
use byo_db::DbError;
use byo_db::signups::SignupRow;
use byo_db::users::{NewUser, UserRow};
use byo_wire::Role;
use byo_wire::api::UserView;
use serde_json::json;

use crate::auth::session::start_session;
use crate::error::{AppError, AppResult};
use crate::metrics::OutcomeLabels;
use crate::state::AppState;

pub const MIN_PASSWORD_CHARS: usize = 12;
const MAX_PASSWORD_BYTES: usize = byo_wire::limits::PASSWORD;

/// Lower-case and check an email address; the error says what is wrong with it.
pub fn normalize_email(raw: &str) -> AppResult<String> {
    let email = raw.trim().to_lowercase();
    let valid = email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(email.split_once('@'), Some((local, domain))
            if !local.is_empty() && !domain.is_empty() && !domain.contains('@'));
    if valid {
        Ok(email)
    } else {
        Err(AppError::bad_request(
            "invalid_email",
            "that does not look like an email address",
        ))
    }
}

/// An address a new account may be made with (issue #36, 8): [`normalize_email`]'s, and
/// also ASCII only (an internationalised domain in its `xn--` form), with no empty label
/// in the domain — no trailing dot, no `..` — so no address can pass for another: a
/// Cyrillic "а" for a Latin "a", `example.com.` for `example.com`. Sign-in keeps reading
/// with [`normalize_email`] alone, so an account made before this still signs in.
pub fn check_new_email(raw: &str) -> AppResult<String> {
    let email = normalize_email(raw)?;
    let refuse = |why: &str| {
        Err(AppError::bad_request(
            "invalid_email",
            format!("that address cannot be used: {why}"),
        ))
    };
    if !email.is_ascii() {
        return refuse(
            "write it in plain ASCII letters (an internationalised domain in its xn-- form)",
        );
    }
    let domain = email.rsplit_once('@').map_or("", |(_, d)| d);
    if domain.split('.').any(str::is_empty) {
        return refuse("its domain has an empty part (a trailing dot, two dots)");
    }
    Ok(email)
}

/// The strength a password must reach on zxcvbn's 0–4 scale: 3, "safely unguessable" —
/// about 10^8 guesses, out of reach of an online attack and costly offline against argon2.
pub const MIN_PASSWORD_SCORE: zxcvbn::Score = zxcvbn::Score::Three;

/// A password is long enough, not too long to hash, and not guessable: zxcvbn's estimate,
/// which knows common passwords, words, names, keyboard walks, repeats and sequences, and
/// `user_inputs` (the user's own email and name).
pub fn check_password(password: &str, user_inputs: &[&str]) -> AppResult<()> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(AppError::bad_request(
            "weak_password",
            format!("a password needs at least {MIN_PASSWORD_CHARS} characters"),
        ));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AppError::bad_request(
            "invalid_password",
            format!("a password is at most {MAX_PASSWORD_BYTES} bytes"),
        ));
    }
    let estimate = zxcvbn::zxcvbn(password, user_inputs);
    if estimate.score() < MIN_PASSWORD_SCORE {
        let hint = estimate
            .feedback()
            .and_then(|f| f.warning().map(|w| format!(" ({w})")))
            .unwrap_or_default();
        return Err(AppError::bad_request(
            "weak_password",
            format!(
                "that password is too easy to guess{hint}; a few uncommon words together are easier to remember and harder to guess"
            ),
        ));
    }
    Ok(())
}

/// Characters that render as nothing or reorder what follows: Unicode's default-ignorable
/// code points (zero-width spaces and joiners, soft hyphens, variation selectors, tags) and
/// the bidirectional controls. A name keeps none of them, so no name can look like another.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}'
        | '\u{FFA0}' | '\u{FFF0}'..='\u{FFF8}' | '\u{1BCA0}'..='\u{1BCA3}'
        | '\u{1D173}'..='\u{1D17A}' | '\u{E0000}'..='\u{E0FFF}')
}

/// A name as it is stored and shown: NFC, invisible and direction-changing characters
/// stripped, every run of whitespace one space, trimmed. Control characters are refused.
/// `field` names it in the refusal.
pub fn normalize_name(field: &'static str, raw: &str, max_chars: usize) -> AppResult<String> {
    use unicode_normalization::UnicodeNormalization;
    if raw.chars().any(|c| c.is_control() && !c.is_whitespace()) {
        return Err(AppError::bad_request(
            "invalid_name",
            format!("{field} may not hold control characters"),
        ));
    }
    let visible: String = raw.nfc().filter(|c| !is_invisible(*c)).collect();
    let name = visible.split_whitespace().collect::<Vec<_>>().join(" ");
    if name.chars().count() > max_chars {
        return Err(AppError::bad_request(
            "invalid_name",
            format!("{field} is at most {max_chars} characters"),
        ));
    }
    Ok(name)
}

/// Names only this installation gives: no one signs up as one.
const RESERVED_NAMES: &[&str] = &[
    "administrator",
    "admin",
    "operator",
    "superadmin",
    "enverge",
];

/// A display name as [`normalize_name`] keeps it, and each word in one script (issue #36,
/// 8): a Latin word with a Cyrillic or Greek letter in it is how a name passes for another
/// ("Pаul", "Administrαtor"); a name wholly in one script, or Japanese's usual mix, is fine.
fn check_display_name(name: &str) -> AppResult<String> {
    use unicode_security::MixedScript;
    let name = normalize_name("display_name", name, byo_wire::limits::NAME_CHARS)?;
    if let Some(word) = name.split(' ').find(|w| !w.is_single_script()) {
        return Err(AppError::bad_request(
            "invalid_name",
            format!(
                "display_name mixes alphabets within a word ({word:?}); write each word in one"
            ),
        ));
    }
    Ok(name)
}

/// Whether `name` reads as one of [`RESERVED_NAMES`]: compared by their Unicode confusable
/// skeletons (UTS #39), so "Admin", "ADMIN" and "Аdmin" with a Cyrillic "А" are all "admin".
fn reads_as_reserved(name: &str) -> bool {
    let skeleton = |s: &str| unicode_security::skeleton(&s.to_lowercase()).collect::<String>();
    let seen = skeleton(name);
    RESERVED_NAMES.iter().any(|r| skeleton(r) == seen)
}

/// An address that already has an account.
pub struct EmailTaken;

/// Create a local user after checking every field.
pub async fn create_account(
    state: &AppState,
    email: &str,
    password: &str,
    display_name: &str,
) -> AppResult<UserRow> {
    try_create_account(state, email, password, display_name)
        .await?
        .map_err(|EmailTaken| {
            AppError::conflict("email_taken", "an account with that email already exists")
        })
}

/// [`create_account`] with a taken address as a value, for a caller that acts on it.
async fn try_create_account(
    state: &AppState,
    email: &str,
    password: &str,
    display_name: &str,
) -> AppResult<Result<UserRow, EmailTaken>> {
    let email = check_new_email(email)?;
    let display_name = check_display_name(display_name)?;
    check_password(password, &[&email, &display_name])?;
    let password_hash = state.passwords.hash(password.to_owned()).await?;
    let new = NewUser {
        email: &email,
        display_name: &display_name,
        password_hash: &password_hash,
    };
    match state.store.create_user(new, state.clock.now()).await {
        Ok(user) => Ok(Ok(user)),
        Err(DbError::Conflict(_)) => Ok(Err(EmailTaken)),
        Err(e) => Err(e.into()),
    }
}

/// Create a user holding superadmin (the `create-superadmin` command and `byo up`).
pub async fn create_superadmin(
    state: &AppState,
    email: &str,
    password: &str,
) -> AppResult<UserRow> {
    let user = create_account(state, email, password, "Administrator").await?;
    let now = state.clock.now();
    state
        .store
        .grant_role(&user.sub, Role::Superadmin, None, now)
        .await?;
    state
        .store
        .audit(
            None,
            "role.grant",
            Some(&user.sub),
            serde_json::json!({"role": "superadmin", "via": "command"}),
            now,
        )
        .await?;
    Ok(user)
}

/// What sign-up answers under `byo up` (`Config::signup_without_mail`), whether the
/// address was new or already had an account: the same words, status and work (the
/// password is hashed either way), and no session, so sign-up tells no one which
/// addresses have accounts (docs/security.md).
pub const SIGNED_UP: &str = "If this address had no account, it has one now: sign in with it \
     and the password you chose. If it already had one, nothing changed: sign in with that \
     account's password.";

/// What sign-up answers everywhere else: a mail went to the address either way (issue #36).
pub const CHECK_YOUR_MAIL: &str = "Check your mail: a message is on its way to that address. \
     If the address had no account, the message holds a link that makes one with the password \
     you chose (the link is good for 24 hours). If it already had one, the message says so \
     and nothing changed.";

/// How long a mailed sign-up link makes an account.
pub const SIGNUP_LINK_HOURS: i64 = 24;

/// What sign-up said, for this installation.
pub fn signed_up_message(state: &AppState) -> &'static str {
    if state.config.signup_without_mail {
        SIGNED_UP
    } else {
        CHECK_YOUR_MAIL
    }
}

/// What sign-up did; only the server's log, audit and the mailbox know.
#[derive(Debug)]
pub enum SignUp {
    /// Made at once (`byo up`).
    Created(UserRow),
    /// A link that makes the account was mailed to the address.
    Mailed,
    /// The address already had an account; it is untouched (and, where mail confirms
    /// sign-ups, its owner was mailed a note saying someone tried).
    Existing,
}

/// Whether anyone may sign up here: sign-up is open, and there is mail to confirm an
/// address with (or `byo up`, which needs none).
pub fn signup_open(state: &AppState) -> AppResult<()> {
    if !state.config.allow_signup {
        return Err(AppError::Forbidden(
            "sign-up is closed on this installation",
        ));
    }
    if !state.config.signup_without_mail && !state.notifier.sends_email() {
        return Err(AppError::unavailable(
            "signup_needs_mail",
            "sign-up confirms each address by mail, and this installation has no mail set up \
             ([notices] smtp_url): ask its operator for an account",
        ));
    }
    Ok(())
}

/// Sign-up, when it is open. Where mail confirms addresses (everywhere but `byo up`) the
/// account is not made here: a link is mailed, and [`confirm_sign_up`] makes it. An address
/// that already has an account is not an error the caller hears about.
pub async fn sign_up(
    state: &AppState,
    email: &str,
    password: &str,
    display_name: &str,
) -> AppResult<SignUp> {
    signup_open(state)?;
    let normalized = check_display_name(display_name)?;
    if reads_as_reserved(&normalized) {
        return Err(AppError::bad_request(
            "invalid_name",
            "that display name is kept for the installation's own accounts",
        ));
    }
    if state.config.signup_without_mail {
        return match try_create_account(state, email, password, display_name).await? {
            Ok(user) => {
                audit_signup(state, &user).await?;
                Ok(SignUp::Created(user))
            }
            Err(EmailTaken) => Ok(SignUp::Existing),
        };
    }
    let email = check_new_email(email)?;
    let display_name = normalized;
    check_password(password, &[&email, &display_name])?;
    // Hashed either way, so a taken address costs what a new one does.
    let password_hash = state.passwords.hash(password.to_owned()).await?;
    let now = state.clock.now();
    let sign_in = crate::app::notices::url(state, "/login");
    let (subject, body, done) = if state.store.user_by_email(&email).await?.is_some() {
        let body = format!(
            "Someone, perhaps you, tried to create an account at {site} with this address.\n\n\
             It already has one, and nothing about it changed. To use it, sign in at\n{sign_in}\n\n\
             If it was not you, you need do nothing.\n",
            site = crate::app::notices::url(state, ""),
        );
        ("Your account already exists", body, SignUp::Existing)
    } else {
        let token = SecretToken::generate(TokenKind::SignupConfirm);
        let row = SignupRow {
            email: email.clone(),
            display_name,
            password_hash,
            created_at: now,
            expires_at: now + chrono::Duration::hours(SIGNUP_LINK_HOURS),
        };
        state.store.create_signup(&token.hash(), &row).await?;
        let link =
            crate::app::notices::url(state, &format!("/signup/confirm?token={}", token.expose()));
        let body = format!(
            "To make your account at {site}, open this link and give the password you chose\n\
             when you signed up:\n\n{link}\n\n\
             The link is good for {SIGNUP_LINK_HOURS} hours and makes one account. If you did not sign up,\n\
             you need do nothing: without that password no account is made with this address.\n",
            site = crate::app::notices::url(state, ""),
        );
        ("Confirm your address", body, SignUp::Mailed)
    };
    if let Err(e) = state.notifier.mail(&email, subject, &body, None).await {
        tracing::warn!(error = %e.error, permanent = e.permanent, "sign-up's mail was not sent");
        return Err(if e.permanent {
            AppError::bad_request(
                "mail_refused",
                "mail to that address was refused: check the address and sign up again",
            )
        } else {
            AppError::unavailable(
                "mail_unavailable",
                "the mail could not be sent just now: sign up again in a few minutes",
            )
        });
    }
    let outcome = match done {
        SignUp::Mailed => "a link that makes the account",
        _ => "a note to the account's owner",
    };
    tracing::info!(outcome, "sign-up mailed");
    Ok(done)
}

async fn audit_signup(state: &AppState, user: &UserRow) -> AppResult<()> {
    state
        .store
        .audit(
            Some(&user.sub),
            "user.signup",
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    Ok(())
}

/// Make the account a mailed link stands for (issue #36), given the password chosen at
/// sign-up: whoever reads the mailbox proves the address, and the password proves they are
/// who signed up, so a stranger's sign-up with someone's address never becomes an account
/// with the stranger's password. Every waiting sign-up of the address is then forgotten.
pub async fn confirm_sign_up(
    state: &AppState,
    token: &str,
    password: &str,
    source: IpAddr,
) -> AppResult<UserRow> {
    let expired = || {
        AppError::bad_request(
            "link_expired",
            "this link has expired or was already used: sign in if you confirmed it already, \
             or sign up again for a new one",
        )
    };
    let Ok(token) = SecretToken::parse(TokenKind::SignupConfirm, token.trim()) else {
        return Err(expired());
    };
    let now = state.clock.now();
    let Some(waiting) = state.store.signup_by_token(&token.hash(), now).await? else {
        return Err(expired());
    };
    state.rate_limits.account(&waiting.email, source, now)?;
    let ok = password.len() <= MAX_PASSWORD_BYTES
        && state
            .passwords
            .verify(Some(waiting.password_hash.clone()), password.to_owned())
            .await?;
    if !ok {
        return Err(AppError::bad_request(
            "wrong_password",
            "that is not the password chosen at sign-up; the account is made only with that one",
        ));
    }
    let new = NewUser {
        email: &waiting.email,
        display_name: &waiting.display_name,
        password_hash: &waiting.password_hash,
    };
    let made = state.store.create_user(new, now).await;
    state.store.delete_signups_of(&waiting.email).await?;
    let user = match made {
        Ok(user) => user,
        Err(DbError::Conflict(_)) => {
            return Err(AppError::conflict(
                "email_taken",
                "this address has an account already: sign in with it",
            ));
        }
        Err(e) => return Err(e.into()),
    };
    state.rate_limits.signed_in(&waiting.email, source, now);
    state.rate_limits.signed_in(&user.sub, source, now);
    Ok(user)
}

/// Record how `user` signed in (`user.signup`, `user.login`) and open their session.
pub async fn open_session(
    state: &AppState,
    user: &UserRow,
    action: &str,
) -> AppResult<Cookie<'static>> {
    state
        .store
        .audit(
            Some(&user.sub),
            action,
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    start_session(state, &user.sub).await
}

/// Sign in with email and password. Unknown emails, wrong passwords and disabled
/// accounts get the same answer, in the same time.
///
/// `source` is the address it came from (`rate_limit::Source`): the limits are per account
/// and source, and per account only for sources it has not signed in from lately, so
/// nobody elsewhere can lock the account's owner out (issue #36).
pub async fn password_sign_in(
    state: &AppState,
    email: &str,
    password: &str,
    source: IpAddr,
) -> AppResult<UserRow> {
    let Ok(email) = normalize_email(email) else {
        return Err(AppError::InvalidCredentials);
    };
    // No hash runs past the limit.
    let now = state.clock.now();
    state.rate_limits.account(&email, source, now)?;
    // No password longer than any we accept is hashed (the sign-in form is not the API's
    // extractor): it cannot be anyone's.
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AppError::InvalidCredentials);
    }
    let user = state.store.user_by_email(&email).await?;
    let ok = state
        .passwords
        .verify(
            user.as_ref().map(|u| u.password_hash.clone()),
            password.to_owned(),
        )
        .await?;
    let outcome = match &user {
        Some(u) if ok && u.disabled_at.is_none() => "success",
        _ => "refused",
    };
    state
        .metrics
        .logins
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
    match user {
        Some(u) if outcome == "success" => {
            state.rate_limits.signed_in(&email, source, now);
            state.rate_limits.signed_in(&u.sub, source, now);
            Ok(u)
        }
        _ => {
            tracing::info!(outcome, "sign-in refused");
            Err(AppError::InvalidCredentials)
        }
    }
}

/// Change `user`'s password: every session of theirs ends, and the new one is returned.
pub async fn change_password(
    state: &AppState,
    user: &UserRow,
    source: IpAddr,
    current_password: String,
    new_password: String,
) -> AppResult<Cookie<'static>> {
    state
        .rate_limits
        .account(&user.sub, source, state.clock.now())?;
    let ok = state
        .passwords
        .verify(Some(user.password_hash.clone()), current_password)
        .await?;
    if !ok {
        return Err(AppError::bad_request(
            "wrong_password",
            "the current password is wrong",
        ));
    }
    check_password(&new_password, &[&user.email, &user.display_name])?;
    let hash = state.passwords.hash(new_password).await?;
    state.store.set_password_hash(&user.sub, &hash).await?;
    state.store.delete_sessions_of(&user.sub).await?;
    state
        .store
        .audit(
            Some(&user.sub),
            "user.password_changed",
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    start_session(state, &user.sub).await
}

/// A user as the API shows them.
pub async fn user_view(state: &AppState, user: UserRow) -> AppResult<UserView> {
    let roles = state.store.roles_of(&user.sub).await?;
    let hosts_owned = state.store.hosts_owned(&user.sub).await?;
    Ok(UserView {
        sub: user.sub,
        email: user.email,
        display_name: user.display_name,
        roles,
        hosts_owned,
        created_at: user.created_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_normalised_or_refused() {
        assert_eq!(
            normalize_email("  Ana@Example.COM ").unwrap(),
            "ana@example.com"
        );
        for bad in ["", "ana", "@x", "ana@", "a b@x", "a@b@c", "a@x\u{7}"] {
            assert!(normalize_email(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_new_address_is_plain_ascii_with_no_empty_label() {
        assert_eq!(
            check_new_email(" Ana@Example.com").unwrap(),
            "ana@example.com"
        );
        assert!(check_new_email("root@localhost").is_ok());
        assert!(check_new_email("ana@xn--bcher-kva.example").is_ok());
        // A Cyrillic "а", a trailing dot, two dots, a leading dot.
        for look_alike in [
            "\u{430}na@example.com",
            "ana@example.com.",
            "ana@example..com",
            "ana@.example.com",
            "ana@bücher.example",
        ] {
            assert!(check_new_email(look_alike).is_err(), "{look_alike:?}");
        }
    }

    #[test]
    fn names_that_pass_for_another_are_refused() {
        for reserved in [
            "Administrator",
            "ADMIN",
            "\u{410}dministrator",   // Cyrillic А
            "Admin\u{200B}istrator", // stripped to Administrator
            "Enverge",
        ] {
            let name = check_display_name(reserved).unwrap_or_else(|_| reserved.to_owned());
            assert!(reads_as_reserved(&name), "{reserved:?}");
        }
        assert!(!reads_as_reserved("Ana Lima"));
        // A word mixing alphabets; one alphabet per word is anyone's name.
        for mixed in ["P\u{430}ul Smith", "Administr\u{3b1}tor"] {
            assert!(check_display_name(mixed).is_err(), "{mixed:?}");
        }
        for fine in [
            "José Núñez",
            "Ελένη Παππά",
            "Олег",
            "山田たろう",
            "Jean-Luc O'Neil",
        ] {
            assert_eq!(check_display_name(fine).unwrap(), fine);
        }
    }

    #[test]
    fn short_long_common_and_trivial_passwords_are_refused() {
        assert!(check_password("elevenchars", &[]).is_err());
        assert!(check_password(&"x".repeat(2000), &[]).is_err());
        for trivial in [
            "passwordpassword",
            "aaaaaaaaaaaa",
            "            ",
            "123456789012",
            "qwertyuiopas",
        ] {
            assert!(check_password(trivial, &[]).is_err(), "{trivial:?}");
        }
        assert!(check_password("ana.lopez@example.com", &["ana.lopez@example.com"]).is_err());
        for fine in [
            "plum kettle ferry orbit",
            "correct horse battery staple",
            "a long enough password",
            "another very long password",
        ] {
            assert!(check_password(fine, &[]).is_ok(), "{fine:?}");
        }
    }

    #[test]
    fn names_are_nfc_without_invisible_or_direction_changing_characters() {
        let n = |s: &str| normalize_name("display_name", s, 100);
        assert_eq!(n("Admin\u{200B}istrator").unwrap(), "Administrator");
        assert_eq!(n("\u{202E}rotartsinimdA").unwrap(), "rotartsinimdA");
        assert_eq!(
            n("Ame\u{0301}lie  \u{2066}Ro\u{2069} ").unwrap(),
            "Am\u{e9}lie Ro"
        );
        assert!(n("bell\u{7}").is_err());
        assert!(n(&"é".repeat(100)).is_ok());
        assert!(n(&"é".repeat(101)).is_err());
    }

    /// The code of a refusal, or "ok".
    fn verdict(password: &str) -> &'static str {
        match check_password(password, &[]) {
            Ok(()) => "ok",
            Err(AppError::BadRequest { code, .. }) => code,
            Err(other) => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_bounds_are_inclusive_twelve_characters_1024_bytes_and_a_score_of_three() {
        // Characters, not bytes: eleven of them in twelve bytes is short.
        assert_eq!(verdict("plum kettle1"), "ok");
        assert!(
            check_password("plum kettl\u{e9}", &[])
                .unwrap_err()
                .to_string()
                .contains("at least 12 characters")
        );
        // A long password that is not guessable: up to the byte limit, not one past it.
        let long: String = (0..MAX_PASSWORD_BYTES as u32)
            .map(|i| char::from(b'!' + ((i * 37 + i / 7) % 90) as u8))
            .collect();
        assert_eq!(verdict(&long), "ok");
        assert_eq!(verdict(&format!("{long}x")), "invalid_password");
        // zxcvbn's 3 exactly passes.
        assert_eq!(
            zxcvbn::zxcvbn("winterGarden42", &[]).score(),
            MIN_PASSWORD_SCORE
        );
        assert_eq!(verdict("winterGarden42"), "ok");
    }
}
