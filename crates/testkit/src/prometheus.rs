//! A real Prometheus server for tests (Debian's `prometheus` package, which `scripts/test.sh`
//! installs): scrapes one target every second, answers PromQL over its HTTP API, and is killed
//! with its test.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

/// Where the binary is (`PROMETHEUS_BIN` overrides).
pub fn binary() -> String {
    std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "/usr/bin/prometheus".into())
}

/// `promtool` next to it (`PROMTOOL_BIN` overrides).
pub fn promtool() -> String {
    std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "/usr/bin/promtool".into())
}

pub struct Prometheus {
    child: Child,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`, path `/metrics`) every second, and
    /// waits until it is ready.
    pub async fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: gateway\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write config");
        let port = crate::free_port();
        let child = Command::new(binary())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start prometheus (scripts/test.sh installs Debian's prometheus package)");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        let c = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        for _ in 0..600 {
            if let Ok(r) = c.get(format!("{}/-/ready", p.url)).send().await {
                if r.status().is_success() {
                    return p;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("prometheus did not become ready");
    }

    /// An instant PromQL query: the `data.result` array.
    pub async fn query(&self, promql: &str) -> Vec<Value> {
        let c = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let bytes = c
            .get(format!("{}/api/v1/query", self.url))
            .query(&[("query", promql)])
            .send()
            .await
            .expect("query")
            .bytes()
            .await
            .expect("answer");
        let r: Value = serde_json::from_slice(&bytes).expect("JSON answer");
        assert_eq!(r["status"], "success", "{promql}: {r}");
        r["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Waits until `promql` gives at least one sample whose value satisfies `ok`; the samples.
    pub async fn wait_for(
        &self,
        promql: &str,
        timeout: Duration,
        ok: impl Fn(f64) -> bool,
    ) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let result = self.query(promql).await;
            let good = result.iter().any(|s| {
                s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse::<f64>().ok())
                    .is_some_and(&ok)
            });
            if good || tokio::time::Instant::now() >= deadline {
                return result;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
