//! `install.sh`, the one-liner's script, and the agent builds it fetches (place 2).
//! The script fetches the agent from this server, checks its digest, installs the three
//! units, and starts preparation only — whose `Wants=` starts serving once credentials
//! exist; on an upgrade it restarts serving instead (J notes 5–6).

use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::state::AppState;

pub const AGENT_BIN: &str = "/usr/local/bin/byo-agent";

pub fn install_script(server: &str) -> String {
    let server = server.trim_end_matches('/');
    let mut units = String::new();
    for (name, body) in byo_core::render::units::units(AGENT_BIN) {
        units.push_str(&format!(
            "cat > /etc/systemd/system/{name} <<'UNIT'\n{body}UNIT\n"
        ));
    }
    format!(
        r#"#!/usr/bin/env bash
# byo host installer, from {server}.
#   curl -fsSL {server}/install.sh | sudo bash -s -- --token TOKEN [--peer --nodes=N]
# The token can also come from a file: --token-file PATH.
set -euo pipefail

server='{server}'
token=""
token_file=""
peer=0
nodes=1
while [ $# -gt 0 ]; do
  case "$1" in
    --token) token="${{2:-}}"; shift 2 ;;
    --token=*) token="${{1#*=}}"; shift ;;
    --token-file) token_file="${{2:-}}"; shift 2 ;;
    --peer) peer=1; shift ;;
    --nodes=*) nodes="${{1#*=}}"; shift ;;
    -h|--help) sed -n '2,4p' "$0" 2>/dev/null || true; exit 0 ;;
    *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (curl ... | sudo bash -s -- ...)" >&2
  exit 1
fi

arch=$(uname -m)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
curl -fsSL "$server/agent/byo-agent-$arch" -o "$work/byo-agent"
curl -fsSL "$server/agent/byo-agent-$arch.sha256" -o "$work/byo-agent.sha256"
expected=$(cut -d' ' -f1 "$work/byo-agent.sha256")
echo "$expected  $work/byo-agent" | sha256sum -c --quiet -

install -d -m 700 /etc/enverge
printf '%s\n' "$server" > /etc/enverge/server
if [ -f /etc/enverge/credentials.json ]; then
  echo "This machine is already enrolled; reusing its credentials."
else
  if [ -z "$token" ] && [ -n "$token_file" ]; then
    token=$(cat "$token_file")
  fi
  if [ -z "$token" ]; then
    echo "install.sh: no token: pass --token or --token-file" >&2
    exit 2
  fi
  (umask 077 && printf '%s\n' "$token" > /etc/enverge/enrol-token)
fi
if [ "$peer" -eq 1 ]; then
  printf '%s\n' "$nodes" > /etc/enverge/peer-nodes
fi
# The owner's login: the one owner-lockout removes, when the host says so.
if [ -n "${{SUDO_USER:-}}" ] && [ "$SUDO_USER" != root ] && [ ! -f /etc/enverge/owner ]; then
  printf '%s\n' "$SUDO_USER" > /etc/enverge/owner
fi

# From here to the end nothing may be cut short: a dropped SSH session must not land
# between writing the binary and writing the units (J note 4).
trap '' HUP INT
if [ -f {bin} ]; then
  cp -p {bin} {bin}.previous
fi
install -m 755 "$work/byo-agent" {bin}.new
mv -f {bin}.new {bin}

{units}systemctl daemon-reload
systemctl enable enverge-agent-prepare.service enverge-agent.service
if systemctl is-active --quiet enverge-agent.service; then
  # An upgrade: serving is running, so Wants= would start nothing. Restart it; the
  # preparation it pulls in finds its record and exits at once.
  systemctl restart enverge-agent.service
else
  # A first install: preparation only. Its Wants= starts serving once it succeeds.
  systemctl start --no-block enverge-agent-prepare.service
fi
echo "byo agent installed. Follow it with: journalctl -fu enverge-agent-prepare"
"#,
        bin = AGENT_BIN,
    )
}

pub async fn install_sh(State(state): State<AppState>) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/x-shellscript; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        install_script(&state.config.public_url),
    )
        .into_response()
}

/// An agent build from the release directory. Only `byo-agent-<arch>[.sha256]` names are
/// served, so no path can reach outside it.
pub async fn agent_file(State(state): State<AppState>, Path(file): Path<String>) -> Response {
    let allowed = file
        .strip_prefix("byo-agent-")
        .map(|rest| rest.strip_suffix(".sha256").unwrap_or(rest))
        .is_some_and(|arch| {
            !arch.is_empty() && arch.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
    let Some(dir) = state.config.release_dir.as_ref().filter(|_| allowed) else {
        return (StatusCode::NOT_FOUND, "no such agent build").into_response();
    };
    match tokio::fs::read(dir.join(&file)).await {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response(),
        Err(_) => (StatusCode::NOT_FOUND, "no such agent build").into_response(),
    }
}
