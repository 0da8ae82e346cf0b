//! A private PostgreSQL cluster for a test: `initdb` and `pg_ctl` from Debian's `postgresql`
//! package (which `scripts/test.sh` installs), on a free loopback port, in a temporary directory,
//! stopped with the test. As root (CI), the server runs as the package's `postgres` user, since
//! PostgreSQL refuses to run as root.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// The directory of `initdb` and `pg_ctl` (`PG_BIN` overrides).
pub fn bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("PG_BIN") {
        return PathBuf::from(d);
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| d.flatten().map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.retain(|p| p.join("initdb").is_file());
    versions.sort();
    versions.pop().unwrap_or_else(|| {
        panic!("PostgreSQL is not installed (scripts/test.sh installs Debian's postgresql package)")
    })
}

fn is_root() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    unsafe {
        libc::geteuid() == 0
    }
}

/// A command of the cluster, run as `postgres` when this process is root.
fn pg_command(tool: &str) -> Command {
    let path = bin_dir().join(tool);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

fn run(mut c: Command, what: &str) {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// How `pg_ctl stop` / `restart` stops the server.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// Clients are disconnected, the server shuts down cleanly.
    Fast,
    /// The server quits at once (crash recovery at the next start).
    Immediate,
}

impl Stop {
    fn as_str(self) -> &'static str {
        match self {
            Stop::Fast => "fast",
            Stop::Immediate => "immediate",
        }
    }
}

/// A running cluster.
pub struct Cluster {
    dir: tempfile::TempDir,
    pub port: u16,
    /// Serving TLS with the certificate and key in the data directory.
    tls: bool,
}

impl Cluster {
    /// Creates and starts a cluster: trust authentication on loopback, `synchronous_commit` on
    /// (the default, said explicitly), `fsync` on.
    pub fn start() -> Cluster {
        Cluster::create(None)
    }

    /// [`Cluster::start`], serving TLS (`ssl=on`) with the certificate and key given (PEM).
    pub fn start_tls(cert_pem: &str, key_pem: &str) -> Cluster {
        Cluster::create(Some((cert_pem, key_pem)))
    }

    fn create(tls: Option<(&str, &str)>) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("agui-pg-")
            .tempdir()
            .expect("tempdir");
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(dir.path());
                    c
                },
                "chown the cluster directory",
            );
        }
        let mut init = pg_command("initdb");
        init.args(["-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
            .arg("-D")
            .arg(dir.path().join("data"));
        run(init, "initdb");
        if let Some((cert, key)) = tls {
            use std::os::unix::fs::PermissionsExt as _;
            let data = dir.path().join("data");
            std::fs::write(data.join("server.crt"), cert).expect("server.crt");
            let key_path = data.join("server.key");
            std::fs::write(&key_path, key).expect("server.key");
            // The server refuses a key others can read.
            std::fs::set_permissions(&key_path, std::fs::Permissions::from_mode(0o600))
                .expect("server.key mode");
            if is_root() {
                run(
                    {
                        let mut c = Command::new("chown");
                        c.args(["postgres:postgres"])
                            .arg(data.join("server.crt"))
                            .arg(&key_path);
                        c
                    },
                    "chown the server's certificate",
                );
            }
        }
        let port = crate::free_port();
        let c = Cluster {
            dir,
            port,
            tls: tls.is_some(),
        };
        c.pg_ctl_start();
        c
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn options(&self) -> String {
        let tls = if self.tls {
            " -c ssl=on -c ssl_cert_file=server.crt -c ssl_key_file=server.key"
        } else {
            ""
        };
        format!(
            "-c listen_addresses=127.0.0.1 -c port={} -c unix_socket_directories={} \
             -c synchronous_commit=on -c fsync=on -c max_connections=200{tls}",
            self.port,
            self.dir.path().display()
        )
    }

    fn pg_ctl_start(&self) {
        let mut c = pg_command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-l"])
            .arg(self.dir.path().join("server.log"))
            .args(["-o", &self.options(), "start"]);
        run(c, "pg_ctl start");
    }

    /// `postgres://postgres@127.0.0.1:<port>/<db>`
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The client program `tool` (`psql`, `createdb`) connected to the cluster as `postgres`.
    fn client(&self, tool: &str) -> Command {
        let port = self.port.to_string();
        let mut c = Command::new(bin_dir().join(tool));
        c.args(["-h", "127.0.0.1", "-p", &port, "-U", "postgres"]);
        c
    }

    /// Creates a database (each test of a cluster can have its own).
    pub fn create_db(&self, name: &str) -> String {
        let mut c = self.client("createdb");
        c.arg(name);
        run(c, "createdb");
        self.url(name)
    }

    /// Runs SQL with `psql` and returns its unaligned, tuples-only output.
    pub fn psql(&self, db: &str, sql: &str) -> String {
        let out = self
            .client("psql")
            .args(["-d", db, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Stops the server.
    pub fn stop(&self, how: Stop) {
        let mut c = pg_command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-m", how.as_str(), "stop"]);
        run(c, "pg_ctl stop");
    }

    /// Starts a stopped server again.
    pub fn start_again(&self) {
        self.pg_ctl_start();
    }

    /// Stops the server, waits `down`, and starts it again.
    pub fn restart(&self, how: Stop, down: Duration) {
        self.stop(how);
        std::thread::sleep(down);
        self.start_again();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let mut c = pg_command("pg_ctl");
        c.arg("-D")
            .arg(self.data())
            .args(["-w", "-m", "immediate", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = c.status();
    }
}
