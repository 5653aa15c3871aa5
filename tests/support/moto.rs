//! Starts moto_server on a free loopback port for one test and stops it on drop.
//! The binary comes from $MOTO_SERVER, else ./.venv/bin/moto_server, else PATH
//! (scripts/test.sh installs it into .venv). No moto: the test fails, it is not skipped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ca_asg_provider::clock::Instant;

pub struct MotoServer {
    child: Child,
    pub url: String,
}

fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("MOTO_SERVER") {
        return PathBuf::from(p);
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/moto_server");
    if venv.exists() {
        return venv;
    }
    PathBuf::from("moto_server")
}

impl MotoServer {
    pub fn start() -> MotoServer {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let bin = binary();
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto ({}): {e}; run scripts/test.sh, which installs moto[server] into .venv", bin.display()));
        let server = MotoServer {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let end = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < end,
                "moto did not start listening on port {port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// An SDK config for this server: static credentials, us-east-1, no retries
    /// (moto answers HTML 500 for unknown names).
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

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
