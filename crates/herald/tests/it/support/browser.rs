//! A real headless Chromium driven over WebDriver (the `chromedriver` of the Debian
//! packages `chromium` and `chromium-driver`, which `scripts/test.sh` installs when
//! missing). A small client of the W3C WebDriver protocol over reqwest, and [`Browser::audit`]:
//! a page's screenshot, its accessibility check (axe-core, run in the same Chromium) and
//! its console, checked together.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};

/// The longest a single WebDriver command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The W3C WebDriver key of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

pub struct Browser {
    driver: Child,
    base: String,
    http: reqwest::Client,
}

impl Browser {
    /// Starts chromedriver and a fresh headless Chromium session.
    pub async fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let driver = Command::new(which("chromedriver"))
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver (Debian package chromium-driver; scripts/test.sh installs it)");
        // A WebDriver command that hangs (a browser stuck on a busy machine) fails the test
        // instead of holding up the whole suite.
        let http = reqwest::Client::builder().timeout(COMMAND_TIMEOUT).build().unwrap();
        let driver_url = format!("http://127.0.0.1:{port}");
        for _ in 0..100 {
            if http.get(format!("{driver_url}/status")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let chrome = json!({
            "binary": which("chromium"),
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1100"],
        });
        let always =
            json!({"browserName": "chrome", "goog:chromeOptions": chrome, "goog:loggingPrefs": {"browser": "ALL"}});
        let capabilities = json!({"capabilities": {"alwaysMatch": always}});
        let session: Value =
            http.post(format!("{driver_url}/session")).json(&capabilities).send().await.unwrap().json().await.unwrap();
        let id = session["value"]["sessionId"].as_str().unwrap_or_else(|| panic!("no WebDriver session: {session}"));
        Self { driver, base: format!("{driver_url}/session/{id}"), http }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap_or_else(|e| panic!("WebDriver {path}: {e}"));
        let answer: Value = response.json().await.unwrap_or_else(|e| panic!("WebDriver {path}: {e}"));
        answer["value"].clone()
    }

    pub async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url}))).await;
    }

    pub async fn url(&self) -> String {
        self.call(reqwest::Method::GET, "/url", None).await.as_str().unwrap().to_owned()
    }

    pub async fn title(&self) -> String {
        self.call(reqwest::Method::GET, "/title", None).await.as_str().unwrap_or_default().to_owned()
    }

    /// The first element matching `css`, if any.
    pub async fn find(&self, css: &str) -> Option<String> {
        let found =
            self.call(reqwest::Method::POST, "/element", Some(json!({"using": "css selector", "value": css}))).await;
        found[ELEMENT].as_str().map(str::to_owned)
    }

    /// The visible text of the first element matching `css` (empty when there is none).
    pub async fn text(&self, css: &str) -> String {
        match self.find(css).await {
            Some(element) => {
                let text = self.call(reqwest::Method::GET, &format!("/element/{element}/text"), None).await;
                text.as_str().unwrap_or_default().to_owned()
            }
            None => String::new(),
        }
    }

    /// Clicks an element that submits a form or follows a link, and returns once the next
    /// page has loaded. (A WebDriver click can return before the navigation starts; a
    /// command sent meanwhile, such as another `goto`, would race it.)
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await.unwrap_or_else(|| panic!("no element {css}"));
        self.run("window.heraldPageBeforeClick = true;").await;
        self.call(reqwest::Method::POST, &format!("/element/{element}/click"), Some(json!({}))).await;
        let next_page = "return window.heraldPageBeforeClick === undefined && document.readyState === 'complete';";
        super::eventually(&format!("a new page after clicking {css}"), || async {
            (self.run(next_page).await == Value::Bool(true)).then_some(())
        })
        .await;
    }

    pub async fn type_into(&self, css: &str, text: &str) {
        let element = self.find(css).await.unwrap_or_else(|| panic!("no element {css}"));
        self.call(reqwest::Method::POST, &format!("/element/{element}/value"), Some(json!({"text": text}))).await;
    }

    /// Runs `script` in the page and returns its result.
    pub async fn run(&self, script: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/sync", Some(json!({"script": script, "args": []}))).await
    }

    /// Runs `script` in the page; it finishes by calling its last argument with the result.
    pub async fn run_async(&self, script: &str) -> Value {
        self.call(reqwest::Method::POST, "/execute/async", Some(json!({"script": script, "args": []}))).await
    }

    /// Commands go to the frame `css` names, until [`Browser::leave_frame`].
    pub async fn enter_frame(&self, css: &str) {
        let element = self.find(css).await.unwrap_or_else(|| panic!("no frame {css}"));
        self.call(reqwest::Method::POST, "/frame", Some(json!({"id": {ELEMENT: element}}))).await;
    }

    pub async fn leave_frame(&self) {
        self.call(reqwest::Method::POST, "/frame/parent", Some(json!({}))).await;
    }

    /// The browser console's messages since the last call, as (level, text).
    pub async fn console(&self) -> Vec<(String, String)> {
        let entries = self.call(reqwest::Method::POST, "/se/log", Some(json!({"type": "browser"}))).await;
        let entries = entries.as_array().unwrap_or_else(|| panic!("no browser log from chromedriver: {entries}"));
        entries
            .iter()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or_default().to_owned(),
                    e["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Checks the page shown as `name`: a screenshot in the artifacts, no console error
    /// since the last check, and no serious or critical accessibility violation (axe-core).
    pub async fn audit(&self, name: &str) {
        self.audit_as(name, None).await;
    }

    /// The same for a page that answers a refusal with `status` (a 404 page, a form sent
    /// back with its problems): the browser logs that status, and nothing else may be.
    pub async fn audit_refusal(&self, name: &str, status: u16) {
        self.audit_as(name, Some(status)).await;
    }

    async fn audit_as(&self, name: &str, status: Option<u16>) {
        let shot = self.screenshot(name).await;
        let expected = status.map(|s| format!("the server responded with a status of {s}"));
        let errors: Vec<String> = self
            .console()
            .await
            .into_iter()
            .filter(|(level, text)| level == "SEVERE" && expected.as_ref().is_none_or(|e| !text.contains(e.as_str())))
            .map(|(_, text)| text)
            .collect();
        assert!(errors.is_empty(), "{name}: console errors {errors:?} (screenshot {})", shot.display());
        let violations = self.axe().await;
        assert!(
            violations.is_empty(),
            "{name}: accessibility violations {violations:#?} (screenshot {})",
            shot.display()
        );
    }

    /// The page's serious and critical violations by axe-core, as "rule (impact): where".
    async fn axe(&self) -> Vec<String> {
        let source = axe_source();
        if self.run("return typeof window.axe;").await != "object" {
            self.run(&format!("{source}\nreturn true;")).await;
        }
        let check = "const done = arguments[arguments.length - 1];
            axe.run(document, {resultTypes: ['violations']}).then(r => done(r.violations
                .filter(v => v.impact === 'serious' || v.impact === 'critical')
                .map(v => v.id + ' (' + v.impact + '): ' + v.nodes.map(n => n.target.join(' ')).join(', ')
                    + ' — ' + v.nodes.map(n => n.failureSummary).join(' | ')))).catch(e => done(['axe failed: ' + e]));";
        let found = self.run_async(check).await;
        found.as_array().unwrap_or_else(|| panic!("axe answered {found}")).iter().map(|v| v.to_string()).collect()
    }

    /// Waits until the address satisfies `want`; on timeout fails with what the browser
    /// shows (address, page text, a screenshot), so a failure says where the page got stuck.
    pub async fn until_url(&self, what: &str, want: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let url = self.url().await;
            if want(&url) {
                return url;
            }
            if tokio::time::Instant::now() > deadline {
                let text = self.text("body").await;
                let shot = self.screenshot(&format!("stuck-{}", what.replace(' ', "-"))).await;
                panic!("timed out waiting for {what}: the browser shows {url}\n{text}\nscreenshot: {}", shot.display());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Saves a PNG of the page under the test artifacts directory; returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD.decode(png.as_str().unwrap()).unwrap();
        let dir = artifacts_dir();
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // End the session first: chromedriver then closes Chromium and removes its profile.
        // Killing only the driver would leave the browser's processes and files behind.
        end_session(&self.base);
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

/// `DELETE` on the session URL, synchronously (drop cannot await), waiting a few seconds
/// at most for the answer.
fn end_session(session_url: &str) {
    use std::io::{Read, Write};
    let Some((host, path)) = session_url.strip_prefix("http://").and_then(|rest| rest.split_once('/')) else {
        return;
    };
    let Ok(mut stream) = std::net::TcpStream::connect(host) else { return };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("DELETE /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_ok() {
        let _ = stream.read(&mut [0u8; 512]);
    }
}

/// Where screenshots go: `HERALD_TEST_ARTIFACTS`, or a directory under the system's temp.
pub fn artifacts_dir() -> PathBuf {
    std::env::var_os("HERALD_TEST_ARTIFACTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("herald-test-artifacts"))
}

/// axe-core's source: `HERALD_TEST_AXE`, which `scripts/test.sh` sets to the pinned package
/// (tests/browser/package.json) it installs.
fn axe_source() -> String {
    let path = std::env::var("HERALD_TEST_AXE").unwrap_or_else(|_| {
        panic!("HERALD_TEST_AXE is not set: run the suite with scripts/test.sh, which installs axe-core")
    });
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading axe-core at {path}: {e}"))
}

fn which(program: &str) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(|dir| PathBuf::from(dir).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not installed (Debian packages chromium, chromium-driver)"))
        .display()
        .to_string()
}
