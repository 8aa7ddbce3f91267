//! `install.sh`, the one-liner's script, and the agent builds it fetches (place 2), and the
//! builds a relay and preparation fetch (`byo-relay-<arch>`, `cloudflared-<arch>`).
//! The script fetches the agent from this server into a temporary directory, checks its
//! digest and its signature by the release key (pinned on the host at its first install,
//! `byo_core::release`), checks it runs here (`--version`), enrols in the foreground (a refusal prints the
//! reason and exits non-zero with nothing installed), then — detached, as the transient unit
//! [`INSTALL_UNIT`], so a dropped SSH session cannot cut it short (J note 4) — keeps the
//! running build as `.previous`, installs the new one, the rollback script and the three
//! units, and starts preparation only, whose `Wants=` starts serving once credentials exist;
//! on an upgrade (already enrolled, no token, /etc/enverge left as it is) it resets and
//! restarts serving instead, and preparation exits at once (J notes 3–6, L1;
//! `docs/upgrades.md`). `--uninstall [--keep-lxd] [--restore-docker] [--leave-satellites]` runs the installed
//! agent's `uninstall` (or, when an uninstall cut short removed it first, fetches it again
//! to finish), and says so when nothing of byo's is installed (H.3–H.4).

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use byo_core::render::units;

use crate::state::AppState;

pub use units::{AGENT_BIN, INSTALL_UNIT};

pub fn install_script(server: &str, release_key: Option<&str>) -> String {
    let server = server.trim_end_matches('/');
    // One OpenSSH line or nothing: it lands between single quotes.
    let release_key = release_key
        .map(str::trim)
        .filter(|k| !k.contains(['\'', '\n', '\\']))
        .unwrap_or("");
    format!(
        r#"#!/usr/bin/env bash
# byo host installer, from {server}.
#   curl -fsSL {server}/install.sh | sudo bash -s -- --token TOKEN [--peer --nodes=N [--peer-login-file FILE]]
#   curl -fsSL {server}/install.sh | sudo bash -s -- --uninstall [--keep-lxd] [--restore-docker]
# The token can also come from a file: --token-file PATH. --uninstall hands the machine
# back: the owner's login restored and proved first, then everything of byo's removed
# (byo-agent uninstall --help says what, in which order, and what stays).
# --peer --nodes=N (a pair or ring): node1's login is asked on this terminal, or read from
# FILE (user on the first line, password on the second; root-only, or it is refused). It is
# kept root-only on this machine, used to find and prepare node1, then deleted; it is never
# sent to {server}.
# A refusal prints its reason, installs nothing and exits with: 1 not root (or another
# failure), 2 usage, 3 the server refused the token (unknown, spent or expired), 4 the token
# is malformed, 5 the server turned this machine away, 6 the server could not be reached,
# 7 no agent build for this architecture, 8 the build is not signed by the release key,
# 9 the other machines were not found (node1 silent, its login refused) while the token lived.
set -euo pipefail

server='{server}'
# The release key, from {server} over TLS: pinned in {pinned} at the first install, and
# from then on the pinned one is what every build must be signed by.
release_key='{release_key}'
token=""
token_file=""
peer=0
nodes=1
peer_login_file=""
uninstall=0
keep_lxd=0
restore_docker=0
leave_satellites=0
say() {{ echo "install.sh: $*" >&2; }}
while [ $# -gt 0 ]; do
  case "$1" in
    --token) token="${{2:-}}"; shift; [ $# -eq 0 ] || shift ;;
    --token=*) token="${{1#*=}}"; shift ;;
    --token-file) token_file="${{2:-}}"; shift; [ $# -eq 0 ] || shift ;;
    --peer) peer=1; shift ;;
    --nodes=*) nodes="${{1#*=}}"; shift ;;
    --uninstall) uninstall=1; shift ;;
    --keep-lxd) keep_lxd=1; shift ;;
    --restore-docker) restore_docker=1; shift ;;
    --leave-satellites) leave_satellites=1; shift ;;
    --peer-login-file) peer_login_file="${{2:-}}"; shift; [ $# -eq 0 ] || shift ;;
    --peer-login-file=*) peer_login_file="${{1#*=}}"; shift ;;
    -h|--help) sed -n '2,17p' "$0" 2>/dev/null || true; exit 0 ;;
    *) say "unknown option $1"; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  say "run as root: curl -fsSL $server/install.sh | sudo bash -s -- --token ..."
  exit 1
fi

uninstall_args=(uninstall --yes)
if [ "$keep_lxd" -eq 1 ]; then uninstall_args+=(--keep-lxd); fi
if [ "$restore_docker" -eq 1 ]; then uninstall_args+=(--restore-docker); fi
if [ "$leave_satellites" -eq 1 ]; then uninstall_args+=(--leave-satellites); fi
if [ "$uninstall" -eq 1 ]; then
  # A dropped SSH session must not cut an uninstall short (a re-run would finish it).
  trap '' HUP
  if [ -x {bin} ]; then
    exec {bin} "${{uninstall_args[@]}}"
  fi
  if [ ! -e /etc/enverge ] && [ ! -e /var/lib/enverge-agent ] &&
    [ -z "$(systemctl list-unit-files 'enverge*' --no-legend 2>/dev/null || true)" ]; then
    echo "Nothing of byo's is installed on this machine: nothing to uninstall."
    exit 0
  fi
  say "the agent is gone but byo's files or units are not (an uninstall cut short): fetching the agent to finish it"
fi

arch=$(uname -m)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# fetch URL FILE: 0 when fetched, 1 on a 404; an unreachable server or any other
# answer ends the install here, with curl's own message above ours.
fetch() {{
  local code
  code=$(curl -sSL --connect-timeout 10 -o "$2" -w '%{{http_code}}' "$1") || {{
    say "could not reach $server (fetching $1); nothing was installed"
    exit 6
  }}
  case "$code" in
    200) return 0 ;;
    404) return 1 ;;
    *) say "$server answered $code for $1; nothing was installed"; exit 1 ;;
  esac
}}
if ! fetch "$server/agent/byo-agent-$arch" "$work/byo-agent"; then
  say "no agent build for $arch: $server offers no byo-agent-$arch (this machine's uname -m); nothing was installed"
  exit 7
fi
if ! fetch "$server/agent/byo-agent-$arch.sha256" "$work/byo-agent.sha256"; then
  say "$server offers byo-agent-$arch without its .sha256; nothing was installed"
  exit 1
fi
expected=$(cut -d' ' -f1 "$work/byo-agent.sha256")
if ! echo "$expected  $work/byo-agent" | sha256sum -c --quiet - >/dev/null 2>&1; then
  say "the agent from $server does not match its sha256sum -c digest; nothing was installed"
  exit 1
fi
# Signed by the release key: the pinned one when this machine has one, else the one above.
if ! fetch "$server/agent/byo-agent-$arch.sig" "$work/byo-agent.sig"; then
  say "$server offers byo-agent-$arch without its signature (.sig); nothing was installed"
  exit 8
fi
if [ -s {pinned} ]; then
  key=$(cat {pinned})
  key_from="the release key pinned on this machine ({pinned})"
else
  key="$release_key"
  key_from="the release key $server names"
fi
if [ -z "$key" ]; then
  say "$server names no release key and none is pinned here: the build cannot be verified; nothing was installed"
  exit 8
fi
printf '{principal} namespaces="{namespace}" %s\n' "$key" > "$work/allowed_signers"
if ! ssh-keygen -Y verify -f "$work/allowed_signers" -I {principal} -n {namespace} \
  -s "$work/byo-agent.sig" < "$work/byo-agent" > "$work/verify.log" 2>&1; then
  say "the agent from $server is not signed by $key_from: $(tr '\n' ' ' < "$work/verify.log" | cut -c1-300); nothing was installed"
  exit 8
fi
chmod 755 "$work/byo-agent"
# A build that cannot run here (another architecture, another libc) stops before anything
# is replaced: the rollback could not save a host from it.
if ! ran=$("$work/byo-agent" --version 2>&1); then
  say "the agent from $server does not run on this machine (byo-agent --version: $ran); nothing was installed"
  exit 1
fi
if [ "$uninstall" -eq 1 ]; then
  status=0
  "$work/byo-agent" "${{uninstall_args[@]}}" || status=$?
  exit "$status"
fi

if [ -f /etc/enverge/credentials.json ]; then
  # An upgrade: no token, and nothing of /etc/enverge changes but the server's address —
  # its modes are what preparation handed serving (0711), and resetting them stops serving.
  printf '%s\n' "$server" > /etc/enverge/server
  echo "This machine is already enrolled; reusing its credentials."
  if [ -n "$token" ] || [ -n "$token_file" ]; then
    echo "The token given was not used (it stays unredeemed until it lapses): this machine keeps its enrolment. To enrol it afresh, hand it back first with install.sh --uninstall."
  fi
else
  if [ -z "$token" ] && [ -n "$token_file" ]; then
    token=$(cat "$token_file")
  fi
  if [ -z "$token" ]; then
    say "no token: pass --token or --token-file"
    exit 2
  fi
  (umask 077 && printf '%s\n' "$token" > "$work/token")
  # Enrol here, in the foreground, so a refusal reaches this terminal; nothing is installed
  # before it succeeds, and a refusal takes away what enrolment created.
  new_etc=0; [ -d /etc/enverge ] || new_etc=1
  new_lib=0; [ -d /var/lib/enverge-agent ] || new_lib=1
  if [ "$new_etc" -eq 1 ]; then install -d -m 700 /etc/enverge; fi
  undo() {{
    if [ "$new_etc" -eq 1 ]; then rm -rf /etc/enverge; else rm -f /etc/enverge/peer-login; fi
    if [ "$new_lib" -eq 1 ]; then rm -rf /var/lib/enverge-agent; fi
  }}
  if [ "$peer" -eq 1 ]; then
    case "$nodes" in
      ''|*[!0-9]*|0|1) say "--nodes must be the host's number of machines (2 or more), not '$nodes'"; undo; exit 2 ;;
    esac
    # Step 123: node1's login, before enrolment, because the cable probe (125) logs in with it.
    printf '%s\n' "$nodes" > /etc/enverge/peer-nodes
    if [ -n "$peer_login_file" ]; then
      if [ ! -f "$peer_login_file" ] || [ -n "$(find "$peer_login_file" -maxdepth 0 -perm /077)" ] ||
        [ "$(stat -c %u "$peer_login_file")" -ne 0 ]; then
        say "--peer-login-file must be a file owned by root and readable by root alone (chmod 600): $peer_login_file; nothing was installed"
        undo; exit 2
      fi
      (umask 077 && head -n 2 "$peer_login_file" > /etc/enverge/peer-login)
    elif [ ! -s /etc/enverge/peer-login ]; then
      if ! {{ exec 3<>/dev/tty; }} 2>/dev/null; then
        say "no terminal to ask node1's login on: pass --peer-login-file FILE (user on the first line, password on the second); nothing was installed"
        undo; exit 2
      fi
      printf "node1's login (it stays on this machine, is deleted once node1 is set up, and is never sent to %s)\nuser: " "$server" >&3
      read -r peer_user <&3
      # Echo off before the prompt, not by read -s after it: a password typed or pasted as
      # the prompt appears would otherwise be shown.
      trap 'stty echo <&3 2>/dev/null; undo; exit 130' INT TERM
      stty -echo <&3 2>/dev/null || true
      printf 'password for %s on node1: ' "$peer_user" >&3
      read -rs peer_password <&3
      stty echo <&3 2>/dev/null || true
      trap - INT TERM
      printf '\n' >&3
      exec 3>&-
      (umask 077 && printf '%s\n%s\n' "$peer_user" "$peer_password" > /etc/enverge/peer-login)
      unset peer_password
    fi
  fi
  enrolled=0
  "$work/byo-agent" enroll --server "$server" --token-file "$work/token" \
    --retry-every 5 --give-up-after 20 </dev/null || enrolled=$?
  if [ "$enrolled" -ne 0 ]; then
    undo
    say "enrolment failed (byo-agent exit $enrolled); nothing was installed"
    exit "$enrolled"
  fi
  printf '%s\n' "$server" > /etc/enverge/server
fi
# The owner's login: the one owner-lockout removes, when the host says so.
if [ -n "${{SUDO_USER:-}}" ] && [ "$SUDO_USER" != root ] && [ ! -f /etc/enverge/owner ]; then
  printf '%s\n' "$SUDO_USER" > /etc/enverge/owner
fi

# Pinned once (a host installed before keys were pinned pins at its next install); later
# builds must be signed by this key whatever a server names.
if [ ! -s {pinned} ]; then
  printf '%s\n' "$key" > {pinned}
  chmod 644 {pinned}
fi

# From here to the end nothing may be cut short: a dropped SSH session must not land
# between writing the binary and writing the units (J note 4). So the rest runs detached,
# as the transient unit {install_unit}, which this terminal only waits for; one install
# runs at a time (a second finds the unit there and stops).
stage=$(mktemp -d /run/enverge-install.XXXXXX)
mv "$work/byo-agent" "$stage/byo-agent"
cat > "$stage/finish.sh" <<'FINISH'
{finish}FINISH
trap 'rm -rf "$work" "$stage"' EXIT
if ! systemd-run --unit={install_unit} --collect --quiet --wait \
  -p StandardOutput=append:"$stage/log" -p StandardError=append:"$stage/log" \
  /bin/bash "$stage/finish.sh" "$stage"; then
  cat "$stage/log" 2>/dev/null >&2 || true
  say "the detached install ({install_unit}) failed or another install is running; see journalctl -u {install_unit}"
  exit 1
fi
cat "$stage/log" 2>/dev/null || true
echo "byo agent installed. Follow it with: journalctl -fu enverge-agent-prepare"
"#,
        bin = AGENT_BIN,
        install_unit = INSTALL_UNIT,
        finish = units::finish_script(AGENT_BIN),
        pinned = byo_core::release::PINNED,
        principal = byo_core::release::PRINCIPAL,
        namespace = byo_core::release::NAMESPACE,
    )
}

pub async fn install_sh(State(state): State<AppState>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/x-shellscript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        install_script(
            &state.config.public_url,
            state.config.release_key.as_deref(),
        ),
    )
        .into_response()
}

/// An agent build from the release directory. Only `byo-agent-<arch>[.sha256|.sig]` names
/// are served, so no path can reach outside it.
/// When a build of the arch is published (`agent_releases`), the newest one is served
/// (`crate::app::releases::served_file`); otherwise the release directory's own files.
pub async fn agent_file(State(state): State<AppState>, Path(file): Path<String>) -> Response {
    use crate::app::releases::Served;
    match crate::app::releases::served_file(&state, &file).await {
        Ok(Some(Served::Bytes(bytes))) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
        Ok(Some(Served::File(path))) => match stream_file(&path).await {
            Ok(response) => response,
            Err(e) => crate::error::AppError::Internal(anyhow::anyhow!(
                "published build {} is missing: {e}",
                path.display()
            ))
            .into_response(),
        },
        Ok(None) => release_file(&state, "byo-agent-", &file, "no such agent build").await,
        Err(e) => e.into_response(),
    }
}

/// How much of a build one response holds at a time.
const CHUNK: usize = 64 * 1024;

/// `path` as the body, read a chunk at a time as the client takes it: a build is megabytes,
/// and a client that never reads must not keep a copy of it in memory (issue #36.4: 20 such
/// readers took the server from 68 to 231 MB when each response held the whole file).
async fn stream_file(path: &std::path::Path) -> std::io::Result<Response> {
    use tokio::io::AsyncReadExt;
    let file = tokio::fs::File::open(path).await?;
    let meta = file.metadata().await?;
    if !meta.is_file() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    let len = meta.len();
    let chunks = futures::stream::try_unfold(file, |mut file| async move {
        let mut chunk = vec![0u8; CHUNK];
        let n = file.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        chunk.truncate(n);
        Ok::<_, std::io::Error>(Some((chunk, file)))
    });
    Ok((
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
            (header::CONTENT_LENGTH, len.to_string()),
        ],
        axum::body::Body::from_stream(chunks),
    )
        .into_response())
}

/// A relay daemon build from the release directory (`byo-relay-<arch>`), which a relay's
/// first-boot script fetches and checks against the sha256 it carries.
pub async fn relay_file(State(state): State<AppState>, Path(file): Path<String>) -> Response {
    release_file(&state, "byo-relay-", &file, "no such relay build").await
}

/// The operator tunnel's connector (`cloudflared-<arch>`), which preparation fetches and
/// checks against the digest enrolment handed it (`[cloudflared.sha256]`), never one served
/// beside it.
pub async fn cloudflared_file(State(state): State<AppState>, Path(file): Path<String>) -> Response {
    if file.ends_with(".sha256") {
        return (StatusCode::NOT_FOUND, "no such cloudflared build").into_response();
    }
    release_file(&state, "cloudflared-", &file, "no such cloudflared build").await
}

async fn release_file(
    state: &AppState,
    prefix: &str,
    file: &str,
    missing: &'static str,
) -> Response {
    let allowed = file
        .strip_prefix(prefix)
        .map(|rest| {
            rest.strip_suffix(".sha256")
                .or_else(|| rest.strip_suffix(".sig"))
                .unwrap_or(rest)
        })
        .is_some_and(|arch| {
            !arch.is_empty() && arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
    let Some(dir) = state.config.release_dir.as_ref().filter(|_| allowed) else {
        return (StatusCode::NOT_FOUND, missing).into_response();
    };
    match stream_file(&dir.join(file)).await {
        Ok(response) => response,
        Err(_) => (StatusCode::NOT_FOUND, missing).into_response(),
    }
}
