//! Chromium driven through chromedriver, shared by the page tests (`byo-server`'s
//! `browser.rs`) and the README walk-through (`byo`'s `walkthrough.rs`): the flags of
//! DESIGN.md §3, a loud skip without the components (a failure under `CI=true`), and a
//! driver whose process group dies with the test.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::json;

/// DESIGN.md §3's flags, plus headless and a window size so the layout is a desktop one.
pub const CHROMIUM_FLAGS: &[&str] = &[
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1280,1000",
];

fn on_path(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names.iter().find_map(|name| {
        std::env::split_paths(&path)
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Chromium and chromedriver, or a loud skip (a failure under CI).
pub fn components() -> Option<(PathBuf, PathBuf)> {
    let chromium = on_path(&["chromium", "chromium-browser"]);
    let driver = on_path(&["chromedriver"]);
    match (chromium, driver) {
        (Some(c), Some(d)) => Some((c, d)),
        (c, d) => {
            let missing: Vec<&str> = [(c.is_none(), "chromium"), (d.is_none(), "chromedriver")]
                .into_iter()
                .filter_map(|(gone, name)| gone.then_some(name))
                .collect();
            let message = format!(
                "{} not installed (apt-get install -y chromium chromium-driver)",
                missing.join(" and ")
            );
            byo_core::testing::skip(
                "browser",
                &format!("{message}; the page tests in a real browser did not run"),
            );
            None
        }
    }
}

/// chromedriver in its own process group, so dropping it also ends the Chromium it started,
/// whatever state the test left the session in.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.0.id());
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub struct Browser {
    pub client: Client,
    _driver: Driver,
}

impl Browser {
    pub async fn start(chromium: PathBuf, chromedriver: PathBuf) -> Browser {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Driver(
            Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display())),
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": CHROMIUM_FLAGS},
        });
        let serde_json::Value::Object(capabilities) = capabilities else {
            unreachable!()
        };
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| panic!("chromedriver would not start Chromium: {e}"));
        Browser {
            client,
            _driver: driver,
        }
    }
}

impl Browser {
    /// The text of the first element matching `css`, if there is one.
    pub async fn text(&self, css: &str) -> Option<String> {
        match self.client.find(fantoccini::Locator::Css(css)).await {
            Ok(e) => e.text().await.ok(),
            Err(_) => None,
        }
    }

    /// Watch what the page copies, without replacing how: the clipboard API (a secure
    /// origin, such as localhost) and the selection copied with `execCommand` (plain http on
    /// another address). [`Self::copied`] then says what the last copy handed over.
    pub async fn watch_copies(&self) {
        self.client
            .execute(
                "window.byoCopied = null; \
                 const clip = navigator.clipboard; \
                 if (clip && window.isSecureContext) { \
                   const write = clip.writeText.bind(clip); \
                   clip.writeText = (text) => { window.byoCopied = text; return write(text); }; \
                 } \
                 const exec = document.execCommand.bind(document); \
                 document.execCommand = (what, ...rest) => { \
                   const ok = exec(what, ...rest); \
                   if (what === 'copy' && ok) { \
                     const a = document.activeElement; \
                     window.byoCopied = a && 'value' in a ? a.value : String(window.getSelection()); \
                   } \
                   return ok; \
                 };",
                vec![],
            )
            .await
            .unwrap();
    }

    /// What the page copied since [`Self::watch_copies`], if anything.
    pub async fn copied(&self) -> Option<String> {
        let v = self
            .client
            .execute("return window.byoCopied;", vec![])
            .await
            .unwrap();
        v.as_str().map(str::to_owned)
    }

    /// Save what the browser shows as `target/screenshots/<name>` (a PNG), for a person
    /// to look at and for CI to keep.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("a screenshot");
        let path = screenshot_dir().join(name);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// Where the browser tests leave screenshots: the workspace's `target/screenshots`.
pub fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/screenshots")
}

/// axe-core's version, pinned: `scripts/test` installs exactly this one from npm.
pub const AXE_VERSION: &str = "4.10.3";

/// axe-core's script (from npm, installed by `scripts/test` under the cache, or named by
/// `BYO_AXE_JS`), or a loud skip (a failure under CI).
pub fn axe_source() -> Option<String> {
    let path = std::env::var_os("BYO_AXE_JS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("BYO_CACHE").unwrap_or_else(|| "/var/cache/byo".into());
            PathBuf::from(cache).join(format!(
                "axe-core-{AXE_VERSION}/node_modules/axe-core/axe.min.js"
            ))
        });
    match std::fs::read_to_string(&path) {
        Ok(source) => Some(source),
        Err(e) => {
            byo_core::testing::skip(
                "axe-core",
                &format!(
                    "{} could not be read ({e}); the accessibility checks did not run",
                    path.display()
                ),
            );
            None
        }
    }
}

/// What a page fails as a browser sees it at `width` px: axe-core's serious and critical
/// violations (each with the first nodes it names), and a page wider than its window.
pub async fn page_faults(client: &Client, axe: &str, width: u32) -> Vec<String> {
    let mut faults = Vec::new();
    let loaded = client
        .execute("return typeof window.axe !== 'undefined';", vec![])
        .await
        .unwrap();
    if loaded != json!(true) {
        client.execute(axe, vec![]).await.expect("axe-core loads");
    }
    let found = client
        .execute_async(
            "const done = arguments[arguments.length - 1];
             axe.run(document, {resultTypes: ['violations']})
               .then(r => done(r.violations
                 .filter(v => v.impact === 'serious' || v.impact === 'critical')
                 .map(v => `${v.impact} ${v.id}: ${v.help} at ${v.nodes.slice(0, 3)
                   .map(n => n.target.join(' ')).join(', ')}`)))
               .catch(e => done([`axe failed: ${e}`]));",
            vec![],
        )
        .await
        .unwrap();
    for v in found.as_array().cloned().unwrap_or_default() {
        faults.push(format!("{width} px: {}", v.as_str().unwrap_or_default()));
    }
    let m = client
        .execute(
            "return {width: document.documentElement.clientWidth, \
               scroll: document.documentElement.scrollWidth, \
               widest: [...document.querySelectorAll('body *')] \
                 .filter(e => e.getBoundingClientRect().right > document.documentElement.clientWidth + 1) \
                 .slice(0, 3).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') \
                   + (e.className && typeof e.className === 'string' ? '.' + e.className.split(' ').join('.') : ''))};",
            vec![],
        )
        .await
        .unwrap();
    let (inner, scroll) = (
        m["width"].as_f64().unwrap_or_default(),
        m["scroll"].as_f64().unwrap_or_default(),
    );
    if scroll > inner + 1.0 {
        faults.push(format!(
            "{width} px: the page is {scroll} px wide in a {inner} px window (past it: {})",
            m["widest"]
        ));
    }
    faults
}
