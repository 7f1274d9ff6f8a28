//! A real headless Chromium driven over WebDriver (the `chromedriver` of the Debian
//! packages `chromium` and `chromium-driver`, which `scripts/test.sh` installs when
//! missing). A small client of the W3C WebDriver protocol over reqwest.

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
        let capabilities =
            json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": chrome}}});
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

fn which(program: &str) -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .map(|dir| PathBuf::from(dir).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not installed (Debian packages chromium, chromium-driver)"))
        .display()
        .to_string()
}
