//! What installing the service for real needs around the suite's control plane: the
//! service's image (scripts/image.sh), moto on the node's IP for the in-cluster service,
//! the API server where a pod's in-cluster config looks for it (the `kubernetes`
//! Service's cluster IP, 10.96.0.1:443, as kube-proxy would route it), the `kube-root-ca.crt`
//! ConfigMap (the root CA publisher's part), the mTLS certificates of standalone mode,
//! and helm.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ca_asg_provider::clock::Instant;

use anyhow::{bail, Context};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};

use super::control_plane::dies_with_the_test;

/// The `kubernetes` Service's cluster IP for the suite's `--service-cluster-ip-range`
/// (its first address); the API server's serving certificate names it.
pub const SERVICE_IP: &str = "10.96.0.1";

/// `cmd`'s stdout; a failure names the command, its arguments and exit, and shows what it
/// printed.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("run {:?}", cmd.get_program()))?;
    if !out.status.success() {
        bail!(
            "{:?} {:?} failed ({}):\n{}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The service's OCI archive: `E2E_SERVICE_IMAGE` (for example the release image, built
/// by `scripts/image.sh` beforehand), else built now by `scripts/image.sh` from the
/// binary cargo built for these tests (a debug build: CI saves the 15 min of a release
/// build). Named `e2e.local/ca-asg-provider:ci`.
pub fn service_image(out_dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let reference = "e2e.local/ca-asg-provider:ci".to_string();
    if let Some(p) = std::env::var_os("E2E_SERVICE_IMAGE") {
        return Ok((PathBuf::from(p), reference));
    }
    let out = out_dir.join("ca-asg-provider.oci.tar");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let printed = run(Command::new(root.join("scripts/image.sh"))
        .current_dir(root)
        .args(["--binary", env!("CARGO_BIN_EXE_ca-asg-provider")])
        .args(["--ref", &reference])
        .arg("--out")
        .arg(&out))?;
    eprintln!(
        "e2e: the service's image: {}",
        printed.trim().replace('\n', " ")
    );
    Ok((out, reference))
}

/// The API server where a pod's in-cluster config reaches it: `SERVICE_IP:443` on this
/// machine (an address on `lo`, removed on drop), forwarded to the API server on
/// 127.0.0.1, as kube-proxy routes the `kubernetes` Service to the API server. The
/// kubelet gives every pod `KUBERNETES_SERVICE_HOST=10.96.0.1` and `_PORT=443`; the pod's
/// traffic reaches this machine through its bridge gateway.
pub struct ServiceRoute {
    added: bool,
    task: tokio::task::JoinHandle<()>,
}

impl ServiceRoute {
    pub async fn start(api_url: &str) -> anyhow::Result<ServiceRoute> {
        let target = api_url
            .strip_prefix("https://")
            .context("the API server's URL")?
            .to_string();
        let add = Command::new("ip")
            .args(["addr", "add", &format!("{SERVICE_IP}/32"), "dev", "lo"])
            .output()?;
        let stderr = String::from_utf8_lossy(&add.stderr);
        if !add.status.success() && !stderr.contains("File exists") {
            bail!("ip addr add {SERVICE_IP}/32 dev lo: {stderr}");
        }
        let listener = tokio::net::TcpListener::bind((SERVICE_IP, 443))
            .await
            .with_context(|| format!("listen on {SERVICE_IP}:443"))?;
        let task = tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut api) = tokio::net::TcpStream::connect(&target).await {
                        let _ = tokio::io::copy_bidirectional(&mut conn, &mut api).await;
                    }
                });
            }
        });
        Ok(ServiceRoute { added: true, task })
    }
}

impl Drop for ServiceRoute {
    fn drop(&mut self) {
        self.task.abort();
        if self.added {
            let _ = Command::new("ip")
                .args(["addr", "del", &format!("{SERVICE_IP}/32"), "dev", "lo"])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// moto_server listening on `host` (the node's IP, which pods reach through their
/// gateway), stopped on drop. The binary as tests/support/moto.rs finds it.
pub struct Moto {
    child: Child,
    pub url: String,
}

impl Moto {
    pub fn start(host: &str) -> anyhow::Result<Moto> {
        let bin = std::env::var_os("MOTO_SERVER")
            .map(PathBuf::from)
            .or_else(|| {
                let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
                venv.exists().then_some(venv)
            })
            .unwrap_or_else(|| PathBuf::from("moto_server"));
        let port = std::net::TcpListener::bind((host, 0))?.local_addr()?.port();
        let child = dies_with_the_test(Command::new(&bin))
            .args(["-H", host, "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start moto ({})", bin.display()))?;
        let end = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect((host, port)).is_err() {
            if Instant::now() > end {
                bail!("moto did not listen on {host}:{port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Moto {
            child,
            url: format!("http://{host}:{port}"),
        })
    }

    pub async fn sdk_config(&self) -> aws_config::SdkConfig {
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(&self.url)
            .credentials_provider(aws_sdk_autoscaling::config::Credentials::new(
                "test", "test", None, None, "moto",
            ))
            .retry_config(aws_config::retry::RetryConfig::disabled())
            .load()
            .await
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private CA with the standalone mode's server certificate (for `server_name`) and
/// CA's client certificate, PEM: what the chart's `tls.serverSecretName` Secret and CA's
/// client Secret hold when cert-manager is not used.
pub struct Certs {
    pub ca: String,
    pub server: (String, String),
    pub client: (String, String),
}

impl Certs {
    pub fn new(server_name: &str) -> anyhow::Result<Certs> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "e2e ca-asg-provider grpc CA");
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        let leaf = |names: Vec<String>, cn: &str, usage| -> anyhow::Result<(String, String)> {
            let key = KeyPair::generate()?;
            let mut p = CertificateParams::new(names)?;
            p.distinguished_name.push(DnType::CommonName, cn);
            p.extended_key_usages = vec![usage];
            let cert = p.signed_by(&key, &issuer)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        Ok(Certs {
            server: leaf(
                vec![server_name.to_string()],
                "ca-asg-provider",
                ExtendedKeyUsagePurpose::ServerAuth,
            )?,
            client: leaf(
                vec!["cluster-autoscaler".to_string()],
                "cluster-autoscaler",
                ExtendedKeyUsagePurpose::ClientAuth,
            )?,
            ca: issuer.pem(),
        })
    }
}

/// The helm binary: `E2E_HELM`, else `.venv/bin/helm` (scripts/test.sh installs it).
pub fn helm_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("E2E_HELM") {
        return Some(PathBuf::from(p));
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/helm");
    venv.exists().then_some(venv)
}

/// helm against the suite's control plane as its admin, with helm's own state in `home`.
pub struct Helm {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub home: PathBuf,
}

impl Helm {
    pub fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = Command::new(&self.bin);
        cmd.args(args)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_DATA_HOME", self.home.join("data"));
        run(&mut cmd)
    }
}

/// GET `path` over plain HTTP/1.0 from `addr` (the pod's metrics port): status and body.
pub async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await??;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut buf = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// An OCI archive of cluster-autoscaler made from one of the real-CA tier's binaries
/// (`E2E_CA_BINS`, copied out of the official images or built outside the tree: no
/// registry serves CA), laid out as the official image is: the static binary at
/// `/cluster-autoscaler`, working directory `/` (the chart runs `./cluster-autoscaler`),
/// user 65532. Named `e2e.local/cluster-autoscaler:v<version>`. Needs umoci and skopeo
/// (scripts/image.sh installs them) and root.
pub fn ca_image(binary: &Path, version: &str, out_dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let reference = format!("e2e.local/cluster-autoscaler:v{version}");
    let work = out_dir.join("ca-image");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work)?;
    let layout = work.join("oci").display().to_string();
    let image = format!("{layout}:ca");
    let bundle = work.join("bundle");
    run(Command::new("umoci").args(["init", "--layout", &layout]))?;
    run(Command::new("umoci").args(["new", "--image", &image]))?;
    run(Command::new("umoci")
        .args(["unpack", "--image", &image])
        .arg(&bundle))?;
    run(Command::new("install")
        .args(["-m", "0755", "-o", "0", "-g", "0"])
        .arg(binary)
        .arg(bundle.join("rootfs/cluster-autoscaler")))?;
    run(Command::new("umoci")
        .args(["repack", "--image", &image])
        .arg(&bundle))?;
    run(Command::new("umoci").args([
        "config",
        "--image",
        &image,
        "--os",
        "linux",
        "--architecture",
        "amd64",
        "--config.user",
        "65532:65532",
        "--config.workingdir",
        "/",
        "--config.cmd",
        "/cluster-autoscaler",
    ]))?;
    // skopeo names the image (index.json's ref.name, which `ctr images import` uses).
    let named = work.join("named");
    run(Command::new("skopeo").args([
        "copy",
        "--quiet",
        &format!("oci:{image}"),
        &format!("oci:{}:{reference}", named.display()),
    ]))?;
    let out = out_dir.join("cluster-autoscaler.oci.tar");
    run(Command::new("tar")
        .arg("-C")
        .arg(&named)
        .arg("-cf")
        .arg(&out)
        .args(["oci-layout", "index.json", "blobs"]))?;
    Ok((out, reference))
}
