//! `base-image`: step 12 of the list in `docs/prepare.md`.
//!
//! **Check:** alias `lofispark-base` points at an image whose `enverge.recipe` is this build's
//! recipe digest.
//! **Apply:** build in `enverge-image-build` from the embedded script and banner with the profile's
//! `cuda_repo_arch`, publish, **then the alias, last**; on a failed build, name the cause (FORWARD
//! DROP → docker-purge; default-deny ufw → firewall).
//! **Why here:** The lifecycle launches by alias; an image without one fails every create.
//!
//! The image is lofispark-base, built from a script the agent carries (`assets/`), with the
//! profile's cuda_repo_arch.

use byo_core::prepare::Check;
use byo_wire::profile::BaseImage as Flavour;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::StepDef;
use super::shared::{NEEDS_LXD, PROFILE_NAME, forward_policy_in_file, lxd_answers, ufw_active};
use crate::host::{Fallible, Host, LxdBody, apt_install, must, package_installed};
use crate::lxd;
use crate::prepare::Plan;

pub use crate::names::{BASE_ALIAS, BUILD_INSTANCE, LOGIN_BANNER};
pub const BUILDER_SCRIPT: &str = include_str!("../../../assets/build-base-image.sh");
pub const UDHCPC_SCRIPT: &str = include_str!("../../../assets/udhcpc.script");
const RECIPE_PROPERTY: &str = "enverge.recipe";
const SCRATCH_DESCRIPTION: &str = "enverge minimal source (busybox)";
/// The minimal image's init: lo up (the proxy device reaches sshd on 127.0.0.1), a lease in
/// the background, a pair's rails inside the container when it holds them (the script node0's
/// agent writes at create: `workers::RAILS_SCRIPT`, so a restarted head or worker comes back
/// addressed, L3.2), and the customer's sshd (host keys made at first start; keys only).
pub const MINIMAL_INITTAB: &str = "::sysinit:/bin/busybox --install -s\n\
                                   ::sysinit:/bin/busybox ip link set lo up\n\
                                   ::sysinit:/bin/sh -c 'test ! -x /etc/enverge/rails.sh || /etc/enverge/rails.sh'\n\
                                   ::sysinit:/bin/busybox udhcpc -b -q -i eth0 -s /usr/share/udhcpc/default.script\n\
                                   ::respawn:/usr/sbin/dropbear -F -R -E -s -p 22\n";

pub(crate) struct BaseImage;

impl StepDef for BaseImage {
    const NAME: &str = "base-image";

    fn check<H: Host>(h: &mut H, plan: &Plan) -> Fallible<Check> {
        if !lxd_answers(h) {
            return Ok(Check::Needs(NEEDS_LXD.into()));
        }
        let digest = recipe_digest(plan);
        if let Some(alias) = lxd::get(h, &format!("/1.0/images/aliases/{BASE_ALIAS}"))? {
            let target = alias["target"].as_str().unwrap_or_default();
            let image = lxd::get(h, &format!("/1.0/images/{target}"))?;
            let recipe = image
                .as_ref()
                .and_then(|i| i["properties"][RECIPE_PROPERTY].as_str());
            return Ok(if recipe == Some(digest.as_str()) {
                Check::Satisfied
            } else {
                Check::Needs(format!(
                    "rebuild {BASE_ALIAS}: its recipe changed (now {digest})"
                ))
            });
        }
        Ok(Check::Needs(match built(h, &digest)? {
            Some(fp) => format!(
                "give image {} the alias {BASE_ALIAS} (without it every create fails)",
                &fp[..12.min(fp.len())]
            ),
            None => format!(
                "build {BASE_ALIAS} ({}, {})",
                plan.profile.prepare.base_image,
                cuda_arch(plan)
            ),
        }))
    }

    fn apply<H: Host>(h: &mut H, plan: &Plan) -> Fallible<()> {
        let digest = recipe_digest(plan);
        // A run killed part way may have left its build instance behind.
        lxd::delete_instance(h, BUILD_INSTANCE)?;
        let fingerprint = match built(h, &digest)? {
            Some(fp) => fp,
            None => build(h, plan, &digest)?,
        };
        // The last act: the lifecycle launches by alias, so an image without one is useless.
        let alias = format!("/1.0/images/aliases/{BASE_ALIAS}");
        if lxd::get(h, &alias)?.is_some() {
            lxd::json_call(
                h,
                "PUT",
                &alias,
                &json!({"target": fingerprint, "description": ""}),
            )
            .map(drop)
        } else {
            lxd::json_call(
                h,
                "POST",
                "/1.0/images/aliases",
                &json!({"name": BASE_ALIAS, "target": fingerprint}),
            )
            .map(drop)
        }
    }
}

/// What the image is built from: a new builder, banner or architecture is a new recipe,
/// and a new recipe is a rebuild.
pub fn recipe_digest(plan: &Plan) -> String {
    let mut h = Sha256::new();
    for part in [
        BUILDER_SCRIPT,
        LOGIN_BANNER,
        UDHCPC_SCRIPT,
        MINIMAL_INITTAB,
        plan.profile.prepare.base_image.as_str(),
        cuda_arch(plan),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..8])
}

fn cuda_arch(plan: &Plan) -> &str {
    plan.profile.cuda_repo_arch.as_deref().unwrap_or("sbsa")
}

/// The fingerprint of an image carrying this recipe, if one exists.
fn built<H: Host>(h: &mut H, digest: &str) -> Fallible<Option<String>> {
    let images = lxd::get(h, "/1.0/images?recursion=1")?.unwrap_or(Value::Null);
    Ok(images.as_array().into_iter().flatten().find_map(|i| {
        (i["properties"][RECIPE_PROPERTY].as_str() == Some(digest))
            .then(|| i["fingerprint"].as_str().map(str::to_owned))
            .flatten()
    }))
}

fn build<H: Host>(h: &mut H, plan: &Plan, digest: &str) -> Fallible<String> {
    // A scratch source a run killed part way left behind.
    let images = lxd::get(h, "/1.0/images?recursion=1")?.unwrap_or(Value::Null);
    for i in images.as_array().into_iter().flatten() {
        if i["properties"]["description"].as_str() == Some(SCRATCH_DESCRIPTION) {
            let fp = i["fingerprint"].as_str().unwrap_or_default();
            lxd::call(h, "DELETE", &format!("/1.0/images/{fp}"), LxdBody::None)?;
        }
    }
    let flavour = plan.profile.prepare.base_image;
    let (source, scratch) = match flavour {
        Flavour::Minimal => {
            let fp = import_minimal(h)?;
            (json!({"type": "image", "fingerprint": fp}), Some(fp))
        }
        Flavour::Ubuntu => (
            json!({"type": "image", "mode": "pull", "protocol": "simplestreams",
                   "server": "https://cloud-images.ubuntu.com/releases", "alias": "24.04"}),
            None,
        ),
    };
    lxd::json_call(
        h,
        "POST",
        "/1.0/instances",
        &json!({"name": BUILD_INSTANCE, "type": "container", "source": source,
                "profiles": [PROFILE_NAME]}),
    )?;
    let result = run_builder(h, flavour.as_str(), cuda_arch(plan));
    let published = result.and_then(|()| {
        lxd::state(h, BUILD_INSTANCE, "stop")?;
        let meta = lxd::json_call(
            h,
            "POST",
            "/1.0/images",
            &json!({"source": {"type": "instance", "name": BUILD_INSTANCE},
                    "properties": {RECIPE_PROPERTY: digest, "description": BASE_ALIAS}}),
        )?;
        meta["fingerprint"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| "LXD published the image without a fingerprint".to_owned())
    });
    let cleanup = lxd::delete_instance(h, BUILD_INSTANCE);
    if let Some(fp) = scratch {
        let _ = lxd::call(h, "DELETE", &format!("/1.0/images/{fp}"), LxdBody::None);
    }
    let fp = published?;
    cleanup?;
    Ok(fp)
}

fn run_builder<H: Host>(h: &mut H, flavour: &str, arch: &str) -> Fallible<()> {
    lxd::state(h, BUILD_INSTANCE, "start")?;
    lxd::push(
        h,
        BUILD_INSTANCE,
        "/root/build-base-image.sh",
        BUILDER_SCRIPT.as_bytes(),
        0o755,
    )?;
    lxd::push(
        h,
        BUILD_INSTANCE,
        "/root/login-banner.txt",
        LOGIN_BANNER.as_bytes(),
        0o644,
    )?;
    let run = lxd::exec(
        h,
        BUILD_INSTANCE,
        &["/bin/sh", "/root/build-base-image.sh", flavour, arch],
    )?;
    if run.code == 0 {
        return Ok(());
    }
    let said = crate::host::last_lines(&run.stderr, &run.stdout);
    Err(match diagnose(h)? {
        Some(cause) => format!("the image build failed ({said}); {cause}"),
        None => format!("the image build failed with {}: {said}", run.code),
    })
}

/// The build's failure never names its cause (it dies resolving the archive); look for
/// the two that cause it and name them.
fn diagnose<H: Host>(h: &mut H) -> Fallible<Option<String>> {
    let docker = h.run(&["iptables", "-S", "FORWARD"], None)?;
    if docker.ok() && docker.stdout.lines().any(|l| l.trim() == "-P FORWARD DROP") {
        return Ok(Some(
            "the iptables FORWARD policy is DROP (Docker sets it), which breaks lxdbr0's NAT: docker-purge must run before base-image".into(),
        ));
    }
    if ufw_active(h)? && forward_policy_in_file(h)?.as_deref() != Some("ACCEPT") {
        return Ok(Some(
            "ufw is active with a default-deny policy, which drops the bridge's DHCP and DNS and forwarded container traffic: firewall must run before base-image".into(),
        ));
    }
    Ok(None)
}

/// The test profile's source image: busybox from the host, as a unified LXD image tarball.
fn import_minimal<H: Host>(h: &mut H) -> Fallible<String> {
    for pkg in ["busybox-static", "dropbear-bin"] {
        if !package_installed(h, pkg)? {
            apt_install(h, &[pkg])?;
        }
    }
    let busybox = h
        .read("/bin/busybox")?
        .ok_or("busybox-static is installed but /bin/busybox is missing")?;
    // The customer's sshd, and the client a pair's head reaches its worker with (dbclient,
    // with the launcher key: K1 note 11), and the libraries they link, as the host has them.
    let mut extra = Vec::new();
    for bin in ["/usr/sbin/dropbear", "/usr/bin/dbclient"] {
        extra.push((
            bin.trim_start_matches('/').to_owned(),
            h.read(bin)?
                .ok_or_else(|| format!("dropbear-bin is installed but {bin} is missing"))?,
        ));
        for lib in must(h, &["ldd", bin])?
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let lib = lib.trim_start_matches('/').to_owned();
            if extra.iter().any(|(p, _)| *p == lib) {
                continue;
            }
            let bytes = h
                .read(&format!("/{lib}"))?
                .ok_or_else(|| format!("/{lib} is missing"))?;
            extra.push((lib, bytes));
        }
    }
    let arch = must(h, &["uname", "-m"])?.trim().to_owned();
    let tarball =
        minimal_rootfs(&busybox, &extra, &arch).map_err(|e| format!("building the rootfs: {e}"))?;
    let headers = [("Content-Type", "application/octet-stream".to_owned())];
    let meta = lxd::call(
        h,
        "POST",
        "/1.0/images",
        LxdBody::Raw {
            bytes: &tarball,
            headers: &headers,
        },
    )?;
    meta["fingerprint"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| "LXD imported the source image without a fingerprint".to_owned())
}

fn minimal_rootfs(
    busybox: &[u8],
    extra: &[(String, Vec<u8>)],
    arch: &str,
) -> std::io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    let file = |tar: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8], mode: u32| {
        let mut hdr = tar::Header::new_gnu();
        hdr.set_size(bytes.len() as u64);
        hdr.set_mode(mode);
        hdr.set_mtime(0);
        hdr.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut hdr, path, bytes)
    };
    let metadata = format!(
        "architecture: {arch}\ncreation_date: 1767225600\nproperties:\n  description: {SCRATCH_DESCRIPTION}\n  os: busybox\n"
    );
    file(&mut tar, "metadata.yaml", metadata.as_bytes(), 0o644)?;
    for dir in [
        "rootfs",
        "rootfs/bin",
        "rootfs/sbin",
        "rootfs/usr",
        "rootfs/usr/bin",
        "rootfs/usr/sbin",
        "rootfs/usr/share",
        "rootfs/usr/share/udhcpc",
        "rootfs/etc",
        "rootfs/dev",
        "rootfs/proc",
        "rootfs/sys",
        "rootfs/tmp",
        "rootfs/root",
        "rootfs/run",
        "rootfs/var",
        "rootfs/etc/dropbear",
    ] {
        let mut hdr = tar::Header::new_gnu();
        hdr.set_size(0);
        hdr.set_mode(if dir == "rootfs/tmp" { 0o1777 } else { 0o755 });
        hdr.set_mtime(0);
        hdr.set_entry_type(tar::EntryType::Directory);
        tar.append_data(&mut hdr, dir, std::io::empty())?;
    }
    file(&mut tar, "rootfs/bin/busybox", busybox, 0o755)?;
    for (link, target) in [
        ("rootfs/bin/sh", "busybox"),
        ("rootfs/sbin/init", "/bin/busybox"),
    ] {
        let mut hdr = tar::Header::new_gnu();
        hdr.set_size(0);
        hdr.set_mode(0o777);
        hdr.set_mtime(0);
        hdr.set_entry_type(tar::EntryType::Symlink);
        tar.append_link(&mut hdr, link, target)?;
    }
    let mut dirs = std::collections::BTreeSet::new();
    for (path, _) in extra {
        let mut d = std::path::Path::new(path).parent();
        while let Some(p) = d.filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(p.to_path_buf());
            d = p.parent();
        }
    }
    for dir in dirs {
        let mut hdr = tar::Header::new_gnu();
        hdr.set_size(0);
        hdr.set_mode(0o755);
        hdr.set_mtime(0);
        hdr.set_entry_type(tar::EntryType::Directory);
        tar.append_data(
            &mut hdr,
            std::path::Path::new("rootfs").join(dir),
            std::io::empty(),
        )?;
    }
    for (path, bytes) in extra {
        file(&mut tar, &format!("rootfs/{path}"), bytes, 0o755)?;
    }
    file(
        &mut tar,
        "rootfs/etc/inittab",
        MINIMAL_INITTAB.as_bytes(),
        0o644,
    )?;
    file(
        &mut tar,
        "rootfs/etc/passwd",
        b"root:x:0:0:root:/root:/bin/sh\n",
        0o644,
    )?;
    file(&mut tar, "rootfs/etc/group", b"root:x:0:\n", 0o644)?;
    file(
        &mut tar,
        "rootfs/usr/share/udhcpc/default.script",
        UDHCPC_SCRIPT.as_bytes(),
        0o755,
    )?;
    tar.into_inner()
}
