//! What serving may ask of LXD (issue #36, "serving is root in all but name").
//!
//! Membership of LXD's `lxd` group is root: a member can create a privileged container, give
//! it the host's `/` as a disk, or point a proxy device at LXD's own socket. So serving (the
//! `spark` account) is not a member. It talks to root's gate (`byo-agent lxd-gate`, its
//! socket open to spark's group alone), which forwards to LXD only the calls below and
//! refuses every other one before LXD sees it:
//!
//! - reads: `GET /1.0`, the default storage pool, an operation (and waiting on it), the list
//!   of instances (answered with ours alone), one of ours, an exec's recorded output;
//! - a create whose body is exactly what serving sends: a container from the base image, on
//!   our profiles, our marker in its config and nothing else, and at most the one SSH proxy
//!   device from the tunnel address's port to the container's own :22;
//! - on one of ours: its state changed, deleted, a command run in it, a file or directory
//!   pushed into it.
//!
//! "Ours" is an instance whose config carries one of [`Rules::markers`] as LXD holds it
//! ([`is_ours`]): the gate reads the instance as root before it forwards a call on it, so
//! the owner's own containers are neither seen nor touched. Pure: the adapter does the IO.

use serde_json::Value;

/// What the gate admits, filled by the agent from its own names.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The image alias every create starts from.
    pub base_alias: String,
    /// The profiles a create may name, the first of them required.
    pub profiles: Vec<String>,
    /// Config keys that mark an instance as ours; a create sets exactly one of them.
    pub markers: Vec<String>,
    /// The marker that carries the instance's SSH port (the proxy device's must match it).
    pub port_key: String,
    /// The ports a customer's SSH may be published on.
    pub ports: std::ops::RangeInclusive<u16>,
    /// The address serving publishes SSH on (the tunnel's); `None` until preparation handed
    /// over, when no proxy device is admitted.
    pub ssh_listen: Option<String>,
}

/// What the adapter does with a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Forward as it is.
    Forward,
    /// Forward once LXD says `instance` is ours ([`is_ours`] on its config); refuse otherwise.
    IfOurs(String),
    /// Forward, then keep only our instances in the answer ([`only_ours`]).
    ListOurs,
    /// Refuse with this reason; LXD never sees the request.
    Refuse(String),
}

fn refuse(why: impl Into<String>) -> Verdict {
    Verdict::Refuse(why.into())
}

/// Judge one request. `path` is the request target (path and query); `header` reads a
/// request header by lower-case name.
pub fn judge(
    rules: &Rules,
    method: &str,
    path: &str,
    header: &dyn Fn(&str) -> Option<String>,
    body: &[u8],
) -> Verdict {
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let query: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    let only = |allowed: &[&str]| query.iter().all(|(k, _)| allowed.contains(k));
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match (method, &segments[..]) {
        ("GET", ["", "1.0"]) if query.is_empty() => Verdict::Forward,
        ("GET", ["", "1.0", "storage-pools", "default"]) if query.is_empty() => Verdict::Forward,
        ("GET", ["", "1.0", "operations", id]) if is_operation(id) && query.is_empty() => {
            Verdict::Forward
        }
        ("GET", ["", "1.0", "operations", id, "wait"])
            if is_operation(id) && only(&["timeout"]) =>
        {
            Verdict::Forward
        }
        ("GET", ["", "1.0", "instances"]) if query == [("recursion", "1")] => Verdict::ListOurs,
        ("POST", ["", "1.0", "instances"]) if query.is_empty() => match create(rules, body) {
            Ok(()) => Verdict::Forward,
            Err(why) => Verdict::Refuse(why),
        },
        (_, ["", "1.0", "instances", name, rest @ ..]) => {
            if !byo_wire::vm::is_instance_name(name) {
                return refuse("not an instance name");
            }
            let admitted = match (method, rest) {
                ("GET", []) | ("DELETE", []) => query.is_empty(),
                ("PUT", ["state"]) => query.is_empty() && state(body).is_ok(),
                ("POST", ["exec"]) => query.is_empty(),
                ("POST", ["files"]) => {
                    only(&["path"])
                        && matches!(
                            header("x-lxd-type").as_deref(),
                            Some("file") | Some("directory")
                        )
                }
                // An exec's recorded output: LXD 5.0 keeps it under logs/, later ones under
                // logs/exec-output/.
                ("GET", ["logs", file] | ["logs", "exec-output", file]) => {
                    query.is_empty()
                        && file.starts_with("exec_")
                        && file
                            .bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                }
                _ => false,
            };
            if admitted {
                Verdict::IfOurs((*name).to_owned())
            } else {
                refuse(format!("{method} {path} is not among what serving may do"))
            }
        }
        _ => refuse(format!("{method} {path} is not among what serving may do")),
    }
}

fn is_operation(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
}

/// A state change: start, stop, restart, with a timeout and force. Nothing else rides in.
fn state(body: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "a state change that is not JSON")?;
    let o = v
        .as_object()
        .ok_or("a state change that is not an object")?;
    if !o
        .keys()
        .all(|k| ["action", "timeout", "force", "stateful"].contains(&k.as_str()))
    {
        return Err("a state change with more than an action".into());
    }
    match o.get("action").and_then(Value::as_str) {
        Some("start" | "stop" | "restart") => Ok(()),
        _ => Err("a state change other than start, stop or restart".into()),
    }
}

/// The create serving sends, and nothing more.
fn create(rules: &Rules, body: &[u8]) -> Result<(), String> {
    let v: Value = serde_json::from_slice(body).map_err(|_| "a create that is not JSON")?;
    let o = v.as_object().ok_or("a create that is not an object")?;
    if let Some(k) = o.keys().find(|k| {
        !["name", "type", "source", "profiles", "config", "devices"].contains(&k.as_str())
    }) {
        return Err(format!("a create may not set {k}"));
    }
    let name = o.get("name").and_then(Value::as_str).unwrap_or_default();
    if !byo_wire::vm::is_instance_name(name) {
        return Err("a create without an instance name".into());
    }
    if o.get("type").and_then(Value::as_str) != Some("container") {
        return Err("only a container may be created".into());
    }
    let source = serde_json::json!({"type": "image", "alias": rules.base_alias});
    if o.get("source") != Some(&source) {
        return Err(format!(
            "a create must start from the image {}",
            rules.base_alias
        ));
    }
    let profiles: Vec<&str> = o
        .get("profiles")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let named = o
        .get("profiles")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    if profiles.len() != named
        || profiles.first().copied() != rules.profiles.first().map(String::as_str)
        || !profiles
            .iter()
            .all(|p| rules.profiles.iter().any(|q| q == p))
    {
        return Err(format!(
            "a create must be on {} (and may add only {})",
            rules.profiles.first().map_or("", String::as_str),
            rules.profiles[1..].join(", ")
        ));
    }
    let config = o
        .get("config")
        .and_then(Value::as_object)
        .ok_or("a create without its config")?;
    if config.len() != 1 {
        return Err("a create's config holds exactly one marker and nothing else".into());
    }
    let (key, value) = config.iter().next().expect("one entry");
    if !rules.markers.contains(key) {
        return Err(format!("a create may not set {key}"));
    }
    let value = value.as_str().ok_or("a marker that is not a string")?;
    let port = if *key == rules.port_key {
        let port: u16 = value
            .parse()
            .map_err(|_| "an SSH port that is not a number")?;
        if !rules.ports.contains(&port) {
            return Err(format!("SSH port {port} is outside serving's range"));
        }
        Some(port)
    } else {
        if !byo_wire::vm::is_instance_name(value) {
            return Err("a marker that is not an instance name".into());
        }
        None
    };
    let empty = serde_json::Map::new();
    let devices = match o.get("devices") {
        None => &empty,
        Some(d) => d.as_object().ok_or("devices that are not an object")?,
    };
    for (dname, device) in devices {
        let (Some(port), Some(listen)) = (port, rules.ssh_listen.as_deref()) else {
            return Err(format!("a create may not add the device {dname}"));
        };
        let want = serde_json::json!({
            "type": "proxy",
            "listen": format!("tcp:{listen}:{port}"),
            "connect": "tcp:127.0.0.1:22",
        });
        if dname != "ssh" || device != &want {
            return Err(format!(
                "a create may add only the device ssh, from {listen}:{port} to the container's :22"
            ));
        }
    }
    Ok(())
}

/// Whether LXD's record of an instance (`GET /1.0/instances/<name>`'s metadata, or one
/// element of the recursive list) is one of ours.
pub fn is_ours(rules: &Rules, instance: &Value) -> bool {
    rules.markers.iter().any(|k| {
        instance["config"][k]
            .as_str()
            .is_some_and(|v| !v.is_empty())
    })
}

/// LXD's answer to the recursive list with every instance that is not ours taken out.
pub fn only_ours(rules: &Rules, mut answer: Value) -> Value {
    if let Some(list) = answer["metadata"].as_array_mut() {
        list.retain(|i| is_ours(rules, i));
    }
    answer
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules() -> Rules {
        Rules {
            base_alias: "base".into(),
            profiles: vec!["base".into(), "dual".into()],
            markers: vec!["user.port".into(), "user.head".into()],
            port_key: "user.port".into(),
            ports: 22000..=22099,
            ssh_listen: Some("10.8.0.2".into()),
        }
    }

    fn no_header(_: &str) -> Option<String> {
        None
    }

    fn judged(method: &str, path: &str, body: Value) -> Verdict {
        judge(
            &rules(),
            method,
            path,
            &no_header,
            body.to_string().as_bytes(),
        )
    }

    fn good_create() -> Value {
        json!({
            "name": "c1", "type": "container",
            "source": {"type": "image", "alias": "base"},
            "profiles": ["base"],
            "config": {"user.port": "22000"},
            "devices": {"ssh": {"type": "proxy", "listen": "tcp:10.8.0.2:22000", "connect": "tcp:127.0.0.1:22"}},
        })
    }

    #[test]
    fn the_create_serving_sends_passes_and_each_addition_is_refused() {
        assert_eq!(
            judged("POST", "/1.0/instances", good_create()),
            Verdict::Forward
        );
        let mut worker = good_create();
        worker["config"] = json!({"user.head": "c1"});
        worker["devices"] = json!({});
        worker["profiles"] = json!(["base", "dual"]);
        assert_eq!(judged("POST", "/1.0/instances", worker), Verdict::Forward);

        type Change = Box<dyn Fn(&mut Value)>;
        let bad: Vec<(&str, Change)> = vec![
            (
                "privileged",
                Box::new(|v| v["config"]["security.privileged"] = json!("true")),
            ),
            (
                "nesting",
                Box::new(|v| v["config"]["security.nesting"] = json!("true")),
            ),
            (
                "raw.lxc",
                Box::new(|v| v["config"]["raw.lxc"] = json!("lxc.apparmor.profile=unconfined")),
            ),
            (
                "the host's /",
                Box::new(|v| {
                    v["devices"]["host"] = json!({"type": "disk", "source": "/", "path": "/mnt"})
                }),
            ),
            (
                "a proxy to LXD's socket",
                Box::new(
                    |v| v["devices"]["ssh"] = json!({"type": "proxy", "bind": "instance", "listen": "unix:/l", "connect": "unix:/var/lib/lxd/unix.socket"}),
                ),
            ),
            (
                "a bind key",
                Box::new(|v| v["devices"]["ssh"]["bind"] = json!("instance")),
            ),
            (
                "another listen address",
                Box::new(|v| v["devices"]["ssh"]["listen"] = json!("tcp:0.0.0.0:22000")),
            ),
            (
                "a port not the marker's",
                Box::new(|v| v["devices"]["ssh"]["listen"] = json!("tcp:10.8.0.2:22001")),
            ),
            (
                "a port out of range",
                Box::new(|v| {
                    v["config"]["user.port"] = json!("2222");
                    v["devices"]["ssh"]["listen"] = json!("tcp:10.8.0.2:2222");
                }),
            ),
            (
                "another connect",
                Box::new(|v| v["devices"]["ssh"]["connect"] = json!("tcp:192.168.1.1:22")),
            ),
            (
                "a second device",
                Box::new(|v| v["devices"]["gpu2"] = json!({"type": "gpu"})),
            ),
            (
                "a physical nic",
                Box::new(|v| {
                    v["devices"]["eth1"] =
                        json!({"type": "nic", "nictype": "physical", "parent": "eno1"})
                }),
            ),
            (
                "another profile",
                Box::new(|v| v["profiles"] = json!(["base", "default"])),
            ),
            (
                "no base profile",
                Box::new(|v| v["profiles"] = json!(["dual"])),
            ),
            (
                "a profile that is not a string",
                Box::new(|v| v["profiles"] = json!(["base", 1])),
            ),
            (
                "another image",
                Box::new(|v| v["source"] = json!({"type": "image", "alias": "other"})),
            ),
            (
                "a copy of an instance",
                Box::new(|v| v["source"] = json!({"type": "copy", "source": "owners"})),
            ),
            (
                "a virtual machine",
                Box::new(|v| v["type"] = json!("virtual-machine")),
            ),
            ("no marker", Box::new(|v| v["config"] = json!({}))),
            (
                "two markers",
                Box::new(|v| v["config"]["user.head"] = json!("c2")),
            ),
            ("a bad name", Box::new(|v| v["name"] = json!("../x"))),
            ("a top-level key", Box::new(|v| v["stateful"] = json!(true))),
            ("a project", Box::new(|v| v["project"] = json!("other"))),
        ];
        for (what, change) in bad {
            let mut v = good_create();
            change(&mut v);
            assert!(
                matches!(judged("POST", "/1.0/instances", v), Verdict::Refuse(_)),
                "{what} was admitted"
            );
        }
        // Not handed over yet: no proxy device at all.
        let mut r = rules();
        r.ssh_listen = None;
        let body = good_create().to_string();
        assert!(matches!(
            judge(&r, "POST", "/1.0/instances", &no_header, body.as_bytes()),
            Verdict::Refuse(_)
        ));
        assert!(matches!(
            judged("POST", "/1.0/instances?project=x", good_create()),
            Verdict::Refuse(_)
        ));
    }

    #[test]
    fn calls_on_an_instance_wait_for_it_to_be_ours_and_nothing_else_passes() {
        let ifours = Verdict::IfOurs("c1".into());
        assert_eq!(judged("GET", "/1.0/instances/c1", Value::Null), ifours);
        assert_eq!(judged("DELETE", "/1.0/instances/c1", Value::Null), ifours);
        assert_eq!(
            judged("POST", "/1.0/instances/c1/exec", json!({"command": ["id"]})),
            ifours
        );
        assert_eq!(
            judged(
                "PUT",
                "/1.0/instances/c1/state",
                json!({"action": "stop", "timeout": 30, "force": true})
            ),
            ifours
        );
        assert_eq!(
            judged(
                "GET",
                "/1.0/instances/c1/logs/exec-output/exec_1f.stdout",
                Value::Null
            ),
            ifours
        );
        let file = |t: &'static str| move |k: &str| (k == "x-lxd-type").then(|| t.to_owned());
        let other = |k: &str| (k == "x-lxd-type").then(|| "file".to_owned());
        assert!(matches!(
            judge(
                &rules(),
                "POST",
                "/1.0/instances/c1/files?path=/x&project=o",
                &other,
                b""
            ),
            Verdict::Refuse(_)
        ));
        for (t, ok) in [("file", true), ("directory", true), ("symlink", false)] {
            let v = judge(
                &rules(),
                "POST",
                "/1.0/instances/c1/files?path=/etc/motd",
                &file(t),
                b"hi",
            );
            assert_eq!(v == ifours, ok, "{t}");
        }
        assert_eq!(
            judged("GET", "/1.0/instances?recursion=1", Value::Null),
            Verdict::ListOurs
        );
        for (m, p) in [
            ("GET", "/1.0"),
            ("GET", "/1.0/storage-pools/default"),
            ("GET", "/1.0/operations/0b6f-ab12"),
            ("GET", "/1.0/operations/0b6f-ab12/wait?timeout=1800"),
        ] {
            assert_eq!(judged(m, p, Value::Null), Verdict::Forward, "{m} {p}");
        }
        for (m, p, body) in [
            (
                "PATCH",
                "/1.0/instances/c1",
                json!({"config": {"security.privileged": "true"}}),
            ),
            ("PUT", "/1.0/instances/c1", json!({"devices": {}})),
            (
                "PUT",
                "/1.0/instances/c1/state",
                json!({"action": "freeze"}),
            ),
            (
                "PUT",
                "/1.0/instances/c1/state",
                json!({"action": "start", "config": {}}),
            ),
            ("POST", "/1.0/instances/c1", json!({"name": "c2"})),
            ("POST", "/1.0/instances/c1/snapshots", json!({})),
            ("POST", "/1.0/instances/c1/backups", json!({})),
            (
                "GET",
                "/1.0/instances/c1/files?path=/etc/shadow",
                Value::Null,
            ),
            ("GET", "/1.0/instances/c1?project=other", Value::Null),
            ("GET", "/1.0/instances", Value::Null),
            (
                "GET",
                "/1.0/instances?recursion=1&project=other",
                Value::Null,
            ),
            (
                "GET",
                "/1.0/instances/c1/logs/exec-output/../../x",
                Value::Null,
            ),
            (
                "GET",
                "/1.0/operations/0b6f/websocket?secret=s",
                Value::Null,
            ),
            ("DELETE", "/1.0/operations/0b6f", Value::Null),
            ("POST", "/1.0/profiles", json!({"name": "p"})),
            ("PUT", "/1.0/profiles/base", json!({})),
            ("POST", "/1.0/images", json!({})),
            ("DELETE", "/1.0/images/abc", Value::Null),
            ("PATCH", "/1.0/networks/lxdbr0", json!({})),
            (
                "POST",
                "/1.0/storage-pools/default/volumes/custom",
                json!({}),
            ),
            (
                "PUT",
                "/1.0",
                json!({"config": {"core.https_address": ":8443"}}),
            ),
            ("POST", "/1.0/certificates", json!({})),
            ("GET", "/1.0/instances/-bad", Value::Null),
            ("POST", "/1.0/instances/-bad/exec", json!({})),
            ("GET", "/1.1/instances", Value::Null),
            // A query on any read is another read (another project, another target).
            ("GET", "/1.0?project=other", Value::Null),
            (
                "GET",
                "/1.0/storage-pools/default?project=other",
                Value::Null,
            ),
            ("GET", "/1.0/storage-pools/other", Value::Null),
            (
                "GET",
                "/1.0/operations/0b6f-ab12?project=other",
                Value::Null,
            ),
            (
                "GET",
                "/1.0/operations/0b6f-ab12/wait?timeout=5&project=other",
                Value::Null,
            ),
            (
                "GET",
                "/1.0/operations/not-an-op!/wait?timeout=5",
                Value::Null,
            ),
            ("GET", "/1.0/operations/../instances", Value::Null),
            ("GET", "/1.0/instances?recursion=2", Value::Null),
            ("GET", "/1.0/instances/c1?recursion=1", Value::Null),
            ("DELETE", "/1.0/instances/c1?project=other", Value::Null),
            (
                "PUT",
                "/1.0/instances/c1/state?project=other",
                json!({"action": "stop"}),
            ),
            ("PUT", "/1.0/instances/c1/state", Value::Null),
            (
                "POST",
                "/1.0/instances/c1/exec?project=other",
                json!({"command": ["id"]}),
            ),
            (
                "GET",
                "/1.0/instances/c1/logs/exec_1.stdout?project=other",
                Value::Null,
            ),
            (
                "GET",
                "/1.0/instances/c1/logs/exec-output/exec_1/x",
                Value::Null,
            ),
        ] {
            assert!(
                matches!(judged(m, p, body), Verdict::Refuse(_)),
                "{m} {p} was admitted"
            );
        }
    }

    #[test]
    fn only_instances_carrying_a_marker_are_ours() {
        let r = rules();
        assert!(is_ours(&r, &json!({"config": {"user.port": "22000"}})));
        assert!(is_ours(&r, &json!({"config": {"user.head": "c1"}})));
        assert!(!is_ours(&r, &json!({"config": {"user.port": ""}})));
        assert!(!is_ours(&r, &json!({"config": {"user.other": "1"}})));
        assert!(!is_ours(&r, &json!({})));
        let answer = json!({"type": "sync", "metadata": [
            {"name": "c1", "config": {"user.port": "22000"}},
            {"name": "owners", "config": {}},
        ]});
        let kept = only_ours(&r, answer);
        assert_eq!(kept["metadata"].as_array().unwrap().len(), 1);
        assert_eq!(kept["metadata"][0]["name"], "c1");
        assert_eq!(kept["type"], "sync");
    }
}
