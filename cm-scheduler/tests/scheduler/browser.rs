//! Headless Chromium driven over the DevTools protocol, on the pipe Chromium opens with
//! `--remote-debugging-pipe` (it reads commands on descriptor 3 and writes on 4, each message
//! JSON ended by a NUL byte): open a page, evaluate script in it, click an element with the
//! mouse as a person would. A shell maps the two descriptors onto the child's stdin and stdout.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use crate::support::poll_blocking;
use serde_json::{Value, json};
use uuid::Uuid;

/// A headless Chromium with one page open, killed when dropped.
pub struct Browser {
    child: Child,
    commands: ChildStdin,
    answers: Receiver<Value>,
    next_id: u64,
    session: String,
    profile: PathBuf,
}

impl Browser {
    /// Starts Chromium (`CHROMIUM`, else `chromium`) with a fresh profile and one blank page.
    pub fn launch(width: u32, height: u32) -> Browser {
        let browser = std::env::var("CHROMIUM").unwrap_or_else(|_| "chromium".into());
        let profile = std::env::temp_dir().join(format!("cm-cdp-{}", Uuid::new_v4().simple()));
        let mut child = Command::new("bash")
            .arg("-c")
            .arg(r#"exec "$@" 3<&0 4>&1 0</dev/null 1>/dev/null"#)
            .arg("chromium-on-a-pipe")
            .arg(&browser)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
            ])
            .arg("--remote-debugging-pipe")
            .arg(format!("--window-size={width},{height}"))
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {browser} ({e}): install it or set CHROMIUM"));
        let commands = child.stdin.take().expect("the browser's command pipe");
        let mut reader = BufReader::new(child.stdout.take().expect("the browser's answer pipe"));
        let (send, answers) = channel();
        std::thread::spawn(move || {
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                message.pop_if(|b| *b == 0);
                if let Ok(value) = serde_json::from_slice::<Value>(&message)
                    && send.send(value).is_err()
                {
                    break;
                }
                message.clear();
            }
        });
        let mut browser = Browser {
            child,
            commands,
            answers,
            next_id: 0,
            session: String::new(),
            profile,
        };
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }));
        let attached = browser.call(
            "Target.attachToTarget",
            json!({ "targetId": target["targetId"], "flatten": true }),
        );
        browser.session = attached["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        browser
    }

    /// Sends one command (to the page once attached) and waits for its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            command["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&command).unwrap();
        bytes.push(0);
        self.commands
            .write_all(&bytes)
            .and_then(|()| self.commands.flush())
            .expect("writing to the browser");
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.answers.recv_timeout(left) {
                Ok(answer) if answer["id"] == json!(id) => {
                    assert!(answer.get("error").is_none(), "{method} failed: {answer}");
                    return answer["result"].clone();
                }
                // Events, and answers to nobody.
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => panic!("{method}: the browser did not answer"),
                Err(RecvTimeoutError::Disconnected) => panic!("{method}: the browser exited"),
            }
        }
    }

    /// Opens `url` in the page.
    pub fn open(&mut self, url: &str) {
        let navigated = self.call("Page.navigate", json!({ "url": url }));
        assert!(
            navigated.get("errorText").is_none(),
            "opening {url}: {navigated}"
        );
    }

    /// Evaluates `expression` in the page and returns its value.
    pub fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {result}"
        );
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is true in the page (a page loading counts as not yet).
    pub fn wait_for(&mut self, expression: &str) {
        let probe = format!(
            "(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"
        );
        if poll_blocking(
            Duration::from_secs(30),
            || self.eval(&probe),
            |v| *v == json!(true),
        )
        .is_ok()
        {
            return;
        }
        let body = self.eval("document.documentElement.outerHTML");
        panic!("never true: {expression}; the page:\n{body}");
    }

    /// Clicks the middle of the first element matching `selector` with the mouse, as a person
    /// would (it must be visible, and nothing may cover it).
    pub fn click(&mut self, selector: &str) {
        let selector_json = serde_json::to_string(selector).unwrap();
        let at = self.eval(&format!(
            "(() => {{ const e = document.querySelector({selector_json}); if (!e) return null;
               e.scrollIntoView({{block: 'center'}}); const r = e.getBoundingClientRect();
               return r.width > 0 && r.height > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; }})()"
        ));
        let (Some(x), Some(y)) = (at[0].as_f64(), at[1].as_f64()) else {
            let body = self.eval("document.documentElement.outerHTML");
            panic!("nothing visible to click at {selector}; the page:\n{body}");
        };
        for kind in ["mouseMoved", "mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            );
        }
    }

    /// A PNG of the whole page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true }),
        );
        base64_decode(shot["data"].as_str().expect("screenshot data"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Standard base64, as the protocol sends screenshots.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0);
    for v in text.bytes().filter_map(value) {
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}
