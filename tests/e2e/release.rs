//! The release pipeline around the suite (issue 61, 1): `scripts/release.sh` run against
//! a registry on loopback (`crane registry serve`, in memory, from the Go module proxy as
//! the script builds it), and cosign to check what it signed.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};

use super::control_plane::{dies_with_the_test, free_port};
use super::install::run;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// crane and cosign, as `scripts/release.sh --tools` builds them (cached outside the tree).
pub struct Tools {
    pub crane: PathBuf,
    pub cosign: PathBuf,
}

impl Tools {
    pub fn build() -> anyhow::Result<Tools> {
        let printed = run(Command::new(Path::new(ROOT).join("scripts/release.sh"))
            .current_dir(ROOT)
            .arg("--tools")
            .stderr(Stdio::inherit()))?;
        let mut lines = printed.lines();
        match (lines.next(), lines.next()) {
            (Some(crane), Some(cosign)) => Ok(Tools {
                crane: crane.into(),
                cosign: cosign.into(),
            }),
            _ => bail!("scripts/release.sh --tools printed {printed:?}"),
        }
    }

    /// `cosign ARGS` (the registry is plain HTTP on loopback); its stdout.
    pub fn cosign(&self, args: &[&str]) -> anyhow::Result<String> {
        run(Command::new(&self.cosign)
            .args(args)
            .env("COSIGN_PASSWORD", "")
            .env("COSIGN_YES", "true"))
    }

    /// A cosign key pair `NAME.key`/`NAME.pub` in `dir` (an empty password).
    pub fn key_pair(&self, dir: &Path, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        run(Command::new(&self.cosign)
            .current_dir(dir)
            .args(["generate-key-pair", "--output-key-prefix", name])
            .env("COSIGN_PASSWORD", ""))?;
        Ok((
            dir.join(format!("{name}.key")),
            dir.join(format!("{name}.pub")),
        ))
    }
}

/// An OCI registry on 127.0.0.1 (`crane registry serve`, in memory), stopped on drop.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`
    pub host: String,
}

impl Registry {
    pub async fn start(crane: &Path, log: &Path) -> anyhow::Result<Registry> {
        let host = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(log)?;
        let child = dies_with_the_test(Command::new(crane))
            .args(["registry", "serve", "--address", &host])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start crane registry serve")?;
        let registry = Registry { child, host };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            if tokio::net::TcpStream::connect(&registry.host).await.is_ok() {
                return Ok(registry);
            }
            if std::time::Instant::now() > deadline {
                bail!(
                    "the registry on {} did not listen within 20 s",
                    registry.host
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `scripts/release.sh` wrote to its result file.
pub fn run_release(args: &[&str], result: &Path) -> anyhow::Result<serde_json::Value> {
    let started = std::time::Instant::now();
    run(Command::new(Path::new(ROOT).join("scripts/release.sh"))
        .current_dir(ROOT)
        .args(args)
        .arg("--result")
        .arg(result)
        .env("COSIGN_PASSWORD", "")
        .stderr(Stdio::inherit()))?;
    eprintln!(
        "e2e: scripts/release.sh took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let text = std::fs::read_to_string(result).with_context(|| format!("read {result:?}"))?;
    serde_json::from_str(&text).with_context(|| format!("parse {result:?}: {text}"))
}

/// The in-toto statements of `cosign verify-attestation` (one JSON envelope a line,
/// each with a base64 payload).
pub fn statements(verified: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    use base64::Engine as _;
    let mut out = Vec::new();
    for line in verified.lines().filter(|l| !l.trim().is_empty()) {
        let envelope: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("not JSON: {line}"))?;
        let payload = envelope["payload"]
            .as_str()
            .with_context(|| format!("no payload in {line}"))?;
        let bytes = base64::engine::general_purpose::STANDARD.decode(payload)?;
        out.push(serde_json::from_slice(&bytes)?);
    }
    Ok(out)
}
