//! Many simulated BMCs on one loopback listener, for the Redfish poller's fault tests
//! and its benchmark: a DMTF mockup tree served from memory by tokio, every GET
//! answered after a fixed delay, endpoint `i` under the path prefix `/bmc/{i}`. Each
//! endpoint counts its requests and can be switched to fail (HTTP 500), hang, answer
//! junk or answer again at any time.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// What an endpoint does with a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serves the mockup.
    Ok = 0,
    /// HTTP 500 to everything.
    Failing = 1,
    /// Reads the request, never answers.
    Hanging = 2,
    /// HTTP 200 with a body that is not JSON.
    Junk = 3,
}

/// A body per (endpoint, path).
type Bodies = HashMap<(usize, String), Arc<Vec<u8>>>;

struct Shared {
    tree: HashMap<String, Arc<Vec<u8>>>,
    delay: Duration,
    modes: Vec<AtomicU8>,
    requests: Vec<AtomicU64>,
    /// (endpoint, path) pairs answered with 404: resources that went away.
    gone: std::sync::Mutex<Vec<(usize, String)>>,
    /// (endpoint, path) pairs answered with another body.
    replaced: std::sync::Mutex<Bodies>,
}

/// The listener and its runtime; dropping it stops both.
pub struct MockBmcs {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    rt: Option<tokio::runtime::Runtime>,
}

/// Every `index.json` under `dir`, by the URL path it answers (`/redfish/v1/...`).
fn load_tree(dir: &Path) -> HashMap<String, Arc<Vec<u8>>> {
    fn walk(dir: &Path, url: &str, out: &mut HashMap<String, Arc<Vec<u8>>>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().to_string();
            if p.is_dir() {
                walk(&p, &format!("{url}/{name}"), out);
            } else if name == "index.json" {
                if let Ok(b) = std::fs::read(&p) {
                    out.insert(url.to_string(), Arc::new(b));
                }
            }
        }
    }
    let mut out = HashMap::new();
    walk(dir, "/redfish/v1", &mut out);
    out
}

impl MockBmcs {
    /// Serves `n` copies of the mockup in `dir`, each GET answered after `delay`, on a
    /// runtime of its own with `workers` threads.
    ///
    /// # Panics
    /// When the mockup is missing or the listener cannot be bound.
    pub fn start(dir: &Path, n: usize, delay: Duration, workers: usize) -> MockBmcs {
        let tree = load_tree(dir);
        assert!(
            tree.contains_key("/redfish/v1"),
            "no Redfish mockup at {}",
            dir.display()
        );
        let shared = Arc::new(Shared {
            tree,
            delay,
            modes: (0..n).map(|_| AtomicU8::new(Mode::Ok as u8)).collect(),
            requests: (0..n).map(|_| AtomicU64::new(0)).collect(),
            gone: std::sync::Mutex::new(Vec::new()),
            replaced: std::sync::Mutex::new(HashMap::new()),
        });
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers.max(1))
            .thread_name("mock-bmc")
            .enable_all()
            .build()
            .expect("mock BMC runtime");
        let listener = rt.block_on(async {
            let s = tokio::net::TcpSocket::new_v4().expect("socket");
            s.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
            s.listen(4096).expect("listen")
        });
        let addr = listener.local_addr().expect("addr");
        let sh = shared.clone();
        rt.spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let _ = s.set_nodelay(true);
                tokio::spawn(serve(s, sh.clone()));
            }
        });
        MockBmcs {
            addr,
            shared,
            rt: Some(rt),
        }
    }

    /// Endpoint `i`'s base URL.
    pub fn url(&self, i: usize) -> String {
        format!("http://{}/bmc/{i}", self.addr)
    }

    pub fn set_mode(&self, i: usize, mode: Mode) {
        self.shared.modes[i].store(mode as u8, Ordering::SeqCst);
    }

    /// Endpoint `i` answers 404 for `path` (`/redfish/v1/...`) from now on, as when an
    /// outlet or a PDU is removed.
    pub fn remove(&self, i: usize, path: &str) {
        self.shared
            .gone
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((i, path.to_string()));
    }

    /// Endpoint `i` answers `path` (`/redfish/v1/...`) with `body` from now on.
    pub fn replace(&self, i: usize, path: &str, body: Vec<u8>) {
        self.shared
            .replaced
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((i, path.to_string()), Arc::new(body));
    }

    /// Requests endpoint `i` received so far.
    pub fn requests(&self, i: usize) -> u64 {
        self.shared.requests[i].load(Ordering::SeqCst)
    }

    /// Requests all endpoints received so far.
    pub fn total_requests(&self) -> u64 {
        self.shared
            .requests
            .iter()
            .map(|r| r.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for MockBmcs {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// One keep-alive connection: GETs only (no bodies), answered in order.
async fn serve(s: TcpStream, sh: Arc<Shared>) {
    let (r, mut w) = s.into_split();
    let mut r = BufReader::new(r);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).await.unwrap_or(0) == 0 {
            return;
        }
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).await.unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
        }
        let target = line.split_whitespace().nth(1).unwrap_or("/").to_string();
        let (status, body) = answer(&sh, &target).await;
        let head = format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        if w.write_all(head.as_bytes()).await.is_err() || w.write_all(&body).await.is_err() {
            return;
        }
    }
}

async fn answer(sh: &Shared, target: &str) -> (&'static str, Arc<Vec<u8>>) {
    let not_found = || ("404 Not Found", Arc::new(b"{}".to_vec()));
    let Some(rest) = target.strip_prefix("/bmc/") else {
        return not_found();
    };
    let (id, path) = rest.split_once('/').unwrap_or((rest, ""));
    let Some(i) = id.parse::<usize>().ok().filter(|i| *i < sh.modes.len()) else {
        return not_found();
    };
    sh.requests[i].fetch_add(1, Ordering::Relaxed);
    let mode = sh.modes[i].load(Ordering::Relaxed);
    if mode == Mode::Hanging as u8 {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(sh.delay).await;
    if mode == Mode::Failing as u8 {
        return ("500 Internal Server Error", Arc::new(b"oops!".to_vec()));
    }
    if mode == Mode::Junk as u8 {
        return ("200 OK", Arc::new(b"<html>not json</html>".to_vec()));
    }
    let key = format!("/{}", path.trim_end_matches('/'));
    let gone = sh
        .gone
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .any(|(e, p)| *e == i && *p == key);
    if gone {
        return not_found();
    }
    let replaced = sh
        .replaced
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(i, key.clone()))
        .cloned();
    if let Some(b) = replaced {
        return ("200 OK", b);
    }
    match sh.tree.get(&key) {
        Some(b) => ("200 OK", b.clone()),
        None => not_found(),
    }
}
