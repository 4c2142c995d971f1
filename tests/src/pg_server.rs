//! A PostgreSQL server of the test's own (initdb into a temporary folder, its own
//! port), for fault tests that stop it: never the machine's shared one. Run as the
//! `postgres` user when the tests run as root (PostgreSQL refuses root). Shared by the
//! tests crate and serve's tests (orchestrator/tests/postgres_outage_serve.rs, which
//! includes this file by path).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The newest PostgreSQL's binaries Debian installed.
fn bin_dir() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .collect()
        })
        .unwrap_or_default();
    found.retain(|p| p.join("initdb").is_file());
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().unwrap_or_else(|| {
        panic!("this test needs PostgreSQL's server (Debian postgresql: /usr/lib/postgresql/*/bin/initdb)")
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A command of PostgreSQL's, as the postgres user when we are root.
fn pg(tool: &str) -> Command {
    let path = bin_dir().join(tool);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

/// Runs `cmd`, which must succeed (else the test fails with its stderr, as `what`).
fn succeed(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} does not run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("free port")
        .local_addr()
        .expect("addr")
        .port()
}

pub struct PgServer {
    _dir: tempfile::TempDir,
    data: PathBuf,
    pub port: u16,
    running: bool,
    /// Server options beyond the test's defaults (`-c name=value ...`).
    options: String,
}

/// A folder for a cluster, owned by the postgres user when we are root.
fn cluster_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("powerplane-pg")
        .tempdir()
        .expect("tempdir");
    if is_root() {
        let ok = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.path())
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "chown the cluster's folder to postgres");
    }
    dir
}

impl PgServer {
    /// A new cluster (trust authentication on 127.0.0.1), started.
    pub fn start() -> PgServer {
        Self::start_with("")
    }

    /// A primary whose every commit waits until a standby has it
    /// (`synchronous_standby_names = '*'`): start [`PgServer::standby_of`] it next.
    pub fn start_primary() -> PgServer {
        Self::start_with("-c synchronous_standby_names='*' -c synchronous_commit=on")
    }

    /// A streaming standby of `primary` (`pg_basebackup -R`), started on a port of its
    /// own; waits until the primary counts it as its synchronous standby.
    pub fn standby_of(primary: &PgServer) -> PgServer {
        let dir = cluster_dir();
        let data = dir.path().join("data");
        succeed(
            pg("pg_basebackup")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-U",
                    "postgres",
                    "-R",
                    "-X",
                    "stream",
                    "--no-sync",
                ])
                .args(["-p", &primary.port.to_string(), "-D"])
                .arg(&data),
            "pg_basebackup",
        );
        let mut s = PgServer {
            data,
            port: free_port(),
            _dir: dir,
            running: false,
            options: String::new(),
        };
        s.restart();
        let t0 = Instant::now();
        while primary.sql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            != "1"
        {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "the standby never became synchronous"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    /// A cluster that takes TCP connections over TLS only, with a password
    /// (`hostssl ... scram-sha-256`; the Unix socket stays trusted): its certificate
    /// and key copied from `cert` and `key`, the postgres user's password `password`.
    pub fn start_tls(cert: &Path, key: &Path, password: &str) -> PgServer {
        let mut s = Self::start();
        s.stop();
        let owned = |from: &Path, name: &str| {
            let to = s.data.join(name);
            std::fs::copy(from, &to).expect("copy the certificate");
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .expect("chmod");
            if is_root() {
                let ok = Command::new("chown")
                    .arg("postgres:postgres")
                    .arg(&to)
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "chown {name}");
            }
        };
        owned(cert, "server.crt");
        owned(key, "server.key");
        std::fs::write(
            s.data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .expect("pg_hba.conf");
        s.options = "-c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key".into();
        s.restart();
        let done = s.sql(&format!("ALTER USER postgres PASSWORD '{password}'"));
        assert_eq!(done, "ALTER ROLE", "set the password");
        s
    }

    /// A clean stop (`pg_ctl stop -m fast`).
    pub fn stop(&mut self) {
        self.pg_ctl_stop("fast");
    }

    fn pg_ctl_stop(&mut self, mode: &str) {
        let _ = pg("pg_ctl")
            .args(["-w", "-m", mode, "-D"])
            .arg(&self.data)
            .arg("stop")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.running = false;
    }

    /// One statement through `psql` on the Unix socket; its output, trimmed (empty when
    /// it fails).
    pub fn sql(&self, statement: &str) -> String {
        pg("psql")
            .args([
                "-U", "postgres", "-d", "postgres", "-At", "-c", statement, "-h",
            ])
            .arg(self.socket_dir())
            .args(["-p", &self.port.to_string()])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    /// `kill -9` of the postmaster (its backends exit when they see it gone).
    pub fn kill9(&mut self) {
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().map(|l| l.trim().to_string()))
            .expect("postmaster.pid");
        let ok = Command::new("kill")
            .args(["-9", &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill -9 {pid}");
        self.running = false;
    }

    /// A standby made primary (`pg_ctl promote`, waiting until it takes writes).
    pub fn promote(&self) {
        succeed(
            pg("pg_ctl")
                .args(["-w", "-t", "60", "-D"])
                .arg(&self.data)
                .arg("promote"),
            "pg_ctl promote",
        );
    }

    fn start_with(options: &str) -> PgServer {
        let dir = cluster_dir();
        let data = dir.path().join("data");
        succeed(
            pg("initdb")
                .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
                .arg(&data),
            "initdb",
        );
        let mut s = PgServer {
            data,
            port: free_port(),
            _dir: dir,
            running: false,
            options: options.to_string(),
        };
        s.restart();
        s
    }

    fn socket_dir(&self) -> &Path {
        self.data.parent().expect("folder")
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts it again (on the same port and data), waiting until it takes connections.
    pub fn restart(&mut self) {
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off {}",
            self.port,
            self.socket_dir().display(),
            self.options
        );
        succeed(
            pg("pg_ctl")
                .args(["-w", "-t", "60", "-l"])
                .arg(self.socket_dir().join("server.log"))
                .arg("-D")
                .arg(&self.data)
                .args(["-o", &opts, "start"])
                .stdout(Stdio::null()),
            "pg_ctl start",
        );
        self.running = true;
        let t0 = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "postgres did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops it at once, as a crash would (`pg_ctl stop -m immediate`: no checkpoint;
    /// the next start recovers from the WAL).
    pub fn crash(&mut self) {
        self.pg_ctl_stop("immediate");
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.running {
            self.crash();
        }
    }
}
