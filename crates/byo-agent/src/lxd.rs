//! LXD's REST API, over [`Host::lxd`]: the shapes of its answers (sync, async operation,
//! error) read in one place.

use serde_json::{Value, json};

use crate::host::{Fallible, Host, LxdBody};

/// The `metadata` of a sync answer; `None` for a 404.
pub fn get<H: Host + ?Sized>(h: &mut H, path: &str) -> Fallible<Option<Value>> {
    let reply = h.lxd("GET", path, LxdBody::None)?;
    if reply.status == 404 {
        return Ok(None);
    }
    answer(path, reply.status, reply.json()).map(Some)
}

/// A call that changes something; an async answer is waited for. Returns the metadata
/// (of the finished operation, for an async one).
pub fn call<H: Host + ?Sized>(
    h: &mut H,
    method: &str,
    path: &str,
    body: LxdBody<'_>,
) -> Fallible<Value> {
    let reply = h.lxd(method, path, body)?;
    let v = reply.json();
    let meta = answer(path, reply.status, v.clone())?;
    match v["type"].as_str() {
        Some("async") => {
            let op = v["operation"]
                .as_str()
                .ok_or_else(|| format!("LXD {method} {path}: an operation without a path"))?;
            wait(h, op)
        }
        _ => Ok(meta),
    }
}

pub fn json_call<H: Host + ?Sized>(
    h: &mut H,
    method: &str,
    path: &str,
    body: &Value,
) -> Fallible<Value> {
    call(h, method, path, LxdBody::Json(body))
}

fn answer(path: &str, status: u16, v: Value) -> Fallible<Value> {
    if (200..300).contains(&status) && v["type"].as_str() != Some("error") {
        return Ok(v["metadata"].clone());
    }
    let msg = v["error"].as_str().unwrap_or("no message");
    Err(format!("LXD answered {status} for {path}: {msg}"))
}

/// Wait for an operation; its metadata once it succeeded, its error otherwise.
pub fn wait<H: Host + ?Sized>(h: &mut H, operation: &str) -> Fallible<Value> {
    let path = format!("{operation}/wait?timeout=1800");
    let reply = h.lxd("GET", &path, LxdBody::None)?;
    let meta = answer(&path, reply.status, reply.json())?;
    match meta["status"].as_str() {
        Some("Success") => Ok(meta["metadata"].clone()),
        other => Err(format!(
            "LXD operation {}: {}",
            other.unwrap_or("unknown"),
            meta["err"].as_str().unwrap_or("no reason given")
        )),
    }
}

/// What a command run in an instance printed, and how it ended.
#[derive(Clone, Debug, Default)]
pub struct Exec {
    pub code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// Every instance LXD holds, with its config and status (`?recursion=1`).
pub fn instances<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<Value>> {
    Ok(match get(h, "/1.0/instances?recursion=1")? {
        Some(Value::Array(list)) => list,
        _ => Vec::new(),
    })
}

/// Run a command in an instance and collect its output (no websockets: LXD records it).
pub fn exec<H: Host + ?Sized>(h: &mut H, instance: &str, command: &[&str]) -> Fallible<Exec> {
    let body = json!({
        "command": command,
        "environment": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root"},
        "interactive": false,
        "wait-for-websocket": false,
        "record-output": true,
    });
    let meta = json_call(h, "POST", &format!("/1.0/instances/{instance}/exec"), &body)?;
    let mut out = Exec {
        code: meta["return"].as_i64().unwrap_or(-1),
        ..Exec::default()
    };
    for (fd, slot) in [("1", &mut out.stdout), ("2", &mut out.stderr)] {
        if let Some(log) = meta["output"][fd].as_str() {
            let reply = h.lxd("GET", log, LxdBody::None)?;
            *slot = String::from_utf8_lossy(&reply.body).into_owned();
        }
    }
    Ok(out)
}

/// Push a file into an instance.
pub fn push<H: Host + ?Sized>(
    h: &mut H,
    instance: &str,
    path: &str,
    bytes: &[u8],
    mode: u32,
) -> Fallible<()> {
    let headers = [
        ("X-LXD-uid", "0".to_owned()),
        ("X-LXD-gid", "0".to_owned()),
        ("X-LXD-mode", format!("{mode:04o}")),
        ("X-LXD-type", "file".to_owned()),
        ("Content-Type", "application/octet-stream".to_owned()),
    ];
    let path = format!("/1.0/instances/{instance}/files?path={path}");
    let mut tries = 1;
    loop {
        let body = LxdBody::Raw {
            bytes,
            headers: &headers,
        };
        match call(h, "POST", &path, body) {
            Err(e) if forkfile_raced(&e) && tries < FILE_CALL_TRIES => tries += 1,
            done => return done.map(drop),
        }
    }
}

/// How many times a file call is made when it meets [`forkfile_raced`].
pub const FILE_CALL_TRIES: usize = 3;

/// LXD serves file calls through a helper (forkfile) it starts in the instance and stops
/// once idle; a call that meets it stopping fails with `dial unix …/forkfile.sock: connect:
/// no such file or directory` (canonical/lxd#18403, seen in our CI on a push into a
/// just-copied container). The same call made again starts a new helper.
pub fn forkfile_raced(error: &str) -> bool {
    error.contains("forkfile.sock")
}

/// Change an instance's state (start, stop, restart), forced where that applies.
pub fn state<H: Host + ?Sized>(h: &mut H, instance: &str, action: &str) -> Fallible<()> {
    json_call(
        h,
        "PUT",
        &format!("/1.0/instances/{instance}/state"),
        &json!({"action": action, "timeout": 30, "force": action != "start"}),
    )
    .map(drop)
}

/// Delete an instance, stopping it first; absent is fine.
pub fn delete_instance<H: Host + ?Sized>(h: &mut H, instance: &str) -> Fallible<()> {
    let path = format!("/1.0/instances/{instance}");
    let Some(meta) = get(h, &path)? else {
        return Ok(());
    };
    if meta["status"].as_str() == Some("Running") {
        state(h, instance, "stop")?;
    }
    call(h, "DELETE", &path, LxdBody::None).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{LxdReply, Output};

    /// LXD whose file calls fail `raced` times with `error`, then succeed.
    struct Racing {
        raced: usize,
        error: &'static str,
        pushes: usize,
    }

    const RACE: &str =
        "dial unix /proc/self/fd/79/forkfile.sock: connect: no such file or directory";

    impl Host for Racing {
        fn run(&mut self, argv: &[&str], _: Option<&[u8]>) -> Fallible<Output> {
            Err(format!("no programs here: {argv:?}"))
        }
        fn read(&mut self, _: &str) -> Fallible<Option<Vec<u8>>> {
            Ok(None)
        }
        fn write(&mut self, path: &str, _: &[u8], _: u32, _: &str) -> Fallible<()> {
            Err(format!("no writes here: {path}"))
        }
        fn remove(&mut self, path: &str) -> Fallible<()> {
            Err(format!("no removes here: {path}"))
        }
        fn lxd(&mut self, method: &str, path: &str, _: LxdBody<'_>) -> Fallible<LxdReply> {
            assert_eq!(
                (method, path),
                ("POST", "/1.0/instances/c1/files?path=/etc/motd")
            );
            self.pushes += 1;
            let body = if self.pushes <= self.raced {
                json!({"type": "error", "error_code": 500, "error": self.error})
            } else {
                json!({"type": "sync", "metadata": {}})
            };
            let status = if self.pushes <= self.raced { 500 } else { 200 };
            Ok(LxdReply {
                status,
                body: body.to_string().into_bytes(),
            })
        }
        fn describe(&self) -> String {
            "racing LXD".into()
        }
    }

    #[test]
    fn a_push_that_meets_forkfile_stopping_is_made_again_a_bounded_number_of_times() {
        let racing = |raced, error| Racing {
            raced,
            error,
            pushes: 0,
        };
        let mut lxd = racing(FILE_CALL_TRIES - 1, RACE);
        push(&mut lxd, "c1", "/etc/motd", b"hi", 0o644).expect("the last try lands");
        assert_eq!(lxd.pushes, FILE_CALL_TRIES);

        let mut lxd = racing(usize::MAX, RACE);
        let err = push(&mut lxd, "c1", "/etc/motd", b"hi", 0o644).unwrap_err();
        assert!(err.contains("forkfile.sock"), "{err}");
        assert_eq!(lxd.pushes, FILE_CALL_TRIES, "then it gives up, saying why");

        let mut lxd = racing(1, "disk full");
        let err = push(&mut lxd, "c1", "/etc/motd", b"hi", 0o644).unwrap_err();
        assert!(err.contains("disk full"), "{err}");
        assert_eq!(lxd.pushes, 1, "any other failure is not tried again");
    }
}
