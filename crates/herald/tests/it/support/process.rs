//! A `herald serve` child process on test storage, for what only a real process shows:
//! signals, environment variables, and everything it writes to its logs; and one-shot
//! `herald` commands run to their end.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use super::server::{ADMIN_TOKEN, Storage};

pub struct Process {
    child: Child,
    pub base: String,
    /// Everything the process wrote to stdout and stderr so far.
    output: Arc<Mutex<String>>,
}

impl Process {
    pub fn start(storage: &Storage) -> Self {
        Self::start_with(storage, &[])
    }

    /// Starts `herald serve`; `env` comes last, so it overrides the defaults set here.
    pub fn start_with(storage: &Storage, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald"));
        if let Some(url) = &storage.database_url {
            command
                .env("HERALD_DATABASE_URL", url)
                .env("HERALD_SECRET_KEY", &storage.secret_key)
                .env("HERALD_QUEUE__LEASE_MS", "2000");
        }
        command
            .arg("serve")
            .env("HERALD_DATA_DIR", storage.dir.path())
            .env("HERALD_LISTEN", "127.0.0.1:0")
            .env("HERALD_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("HERALD_ALLOWED_NETWORKS", "127.0.0.0/8")
            .env("HERALD_QUEUE__POLL_INTERVAL_MS", "100")
            .env("RUST_LOG", "info");
        command.envs(env.iter().copied());
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawning herald");
        let output: Arc<Mutex<String>> = Arc::default();
        let stdout = child.stdout.take().unwrap();
        let sink = output.clone();
        std::thread::spawn(move || collect(stdout, &sink));
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("herald exited before listening").unwrap();
            push_line(&output, &line);
            if let Some(at) = line.find("addr=") {
                break line[at + 5..].split_whitespace().next().unwrap().to_owned();
            }
            // The same line in JSON (`log.format = "json"`).
            if let Some(at) = line.find("\"addr\":\"") {
                break line[at + 8..].split('"').next().unwrap().to_owned();
            }
        };
        // Keep draining the log so the child never blocks on a full pipe.
        let sink = output.clone();
        std::thread::spawn(move || lines.map_while(Result::ok).for_each(|line| push_line(&sink, &line)));
        Self { child, base: format!("http://{addr}"), output }
    }

    /// One API call with `token`; the status and the JSON answer (`null` if none).
    pub async fn call(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> (reqwest::StatusCode, serde_json::Value) {
        let mut request = reqwest::Client::new().request(method, format!("{}{path}", self.base)).bearer_auth(token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(serde_json::Value::Null))
    }

    /// What the process logged so far (stdout and stderr, interleaved by line).
    pub fn output(&self) -> String {
        self.output.lock().unwrap().clone()
    }

    /// The log as it grows, readable after the process is gone.
    pub fn log(&self) -> Arc<Mutex<String>> {
        self.output.clone()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends a signal (SIGSTOP, SIGCONT, …) and returns at once.
    pub fn signal(&self, signal: i32) {
        // SAFETY: signalling our own child process.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// SIGTERM, then waits for the exit; returns the exit status, how long the exit took
    /// from the signal, and the whole output.
    pub fn terminate(mut self) -> (std::process::ExitStatus, std::time::Duration, String) {
        let signalled = std::time::Instant::now();
        self.signal(libc::SIGTERM);
        let status = self.child.wait().unwrap();
        let took = signalled.elapsed();
        std::thread::sleep(std::time::Duration::from_millis(100));
        (status, took, self.output())
    }

    /// Waits up to `limit` for the process to exit by itself; its exit status and whole
    /// output, or `None` if it is still running then (it is killed).
    pub fn wait(mut self, limit: std::time::Duration) -> Option<(std::process::ExitStatus, String)> {
        let deadline = std::time::Instant::now() + limit;
        while std::time::Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(std::time::Duration::from_millis(100));
                return Some((status, self.output()));
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        self.kill();
        None
    }

    pub fn kill(mut self) {
        self.child.kill().unwrap(); // SIGKILL
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits for the exit; returns the process's whole output.
    pub fn stop(mut self) -> String {
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        self.output()
    }
}

fn collect(stream: impl Read, sink: &Mutex<String>) {
    BufReader::new(stream).lines().map_while(Result::ok).for_each(|line| push_line(sink, &line));
}

fn push_line(sink: &Mutex<String>, line: &str) {
    let mut out = sink.lock().unwrap();
    out.push_str(line);
    out.push('\n');
}

/// Runs a one-shot `herald` command (`backup`, `check-config`, …) to its end, with `env`
/// added and no configuration file or database URL inherited from the test's environment;
/// whether it succeeded, and what it printed (stdout, then stderr).
pub async fn run_herald(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let (code, text) = herald_exit(args, env).await;
    (code == Some(0), text)
}

/// Runs the `herald` binary once like [`run_herald`]; its exit code (none: killed by a
/// signal) and what it printed on stdout then stderr.
pub async fn herald_exit(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_herald"))
        .args(args)
        .env_remove("HERALD_CONFIG")
        .env_remove("HERALD_DATABASE_URL")
        .envs(env.iter().copied())
        .output()
        .await
        .expect("herald runs");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}
