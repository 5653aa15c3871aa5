//! Starts moto_server on a free loopback port for one test and stops it on drop.
//! The binary comes from $MOTO_SERVER, else ./.venv/bin/moto_server, else PATH
//! (scripts/test.sh installs it into .venv). No moto: the test fails, it is not skipped.

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
        // moto binds a port of its own choosing (`-p 0`) and says which: a port picked
        // here and handed over could be taken by another test's moto in between, and
        // then this test would talk to that one until it went away (seen in CI: a
        // connection refused at a test's first call).
        let bin = binary();
        let mut child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start moto ({}): {e}; run scripts/test.sh, which installs moto[server] into .venv", bin.display()));
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads moto's log to its end (a full pipe would stall it), sending the port.
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(port) = line
                    .split("http://127.0.0.1:")
                    .nth(1)
                    .and_then(|rest| rest.trim().parse::<u16>().ok())
                {
                    let _ = tx.send(port);
                }
            }
        });
        let mut server = MotoServer {
            child,
            url: String::new(),
        };
        let port = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("moto said no port within 30 s");
        server.url = format!("http://127.0.0.1:{port}");
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

/// Launch template `name` (an m5.large) in moto, for the groups a test creates.
pub async fn launch_template(sdk: &aws_config::SdkConfig, name: &str) {
    aws_sdk_ec2::Client::new(sdk)
        .create_launch_template()
        .launch_template_name(name)
        .launch_template_data(
            aws_sdk_ec2::types::RequestLaunchTemplateData::builder()
                .image_id("ami-12c6146b")
                .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
                .build(),
        )
        .send()
        .await
        .unwrap();
}

/// The request that creates an ASG.
pub type CreateGroup =
    aws_sdk_autoscaling::operation::create_auto_scaling_group::builders::CreateAutoScalingGroupFluentBuilder;

/// The request that creates ASG `name` (0 to 10, none desired, in us-east-1a) on
/// launch template `lt` at `version`; the caller may add to it, then sends it.
pub fn group_on(
    asgc: &aws_sdk_autoscaling::Client,
    name: &str,
    lt: &str,
    version: &str,
) -> CreateGroup {
    asgc.create_auto_scaling_group()
        .auto_scaling_group_name(name)
        .min_size(0)
        .max_size(10)
        .desired_capacity(0)
        .availability_zones("us-east-1a")
        .launch_template(
            aws_sdk_autoscaling::types::LaunchTemplateSpecification::builder()
                .launch_template_name(lt)
                .version(version)
                .build(),
        )
}

/// `req` (creating ASG `group`) with `tags`, each propagated at launch.
pub fn tagged(mut req: CreateGroup, group: &str, tags: &[(&str, &str)]) -> CreateGroup {
    for (k, v) in tags {
        req = req.tags(
            aws_sdk_autoscaling::types::Tag::builder()
                .resource_id(group)
                .resource_type("auto-scaling-group")
                .key(*k)
                .value(*v)
                .propagate_at_launch(true)
                .build(),
        );
    }
    req
}

/// `ca-asg-provider <command> --aws-endpoint <aws_endpoint> --config <config>` run as
/// an operator runs it against moto, outside any cluster: the static test keys, no
/// AWS config or credentials file, no IRSA variables, no kubeconfig, `home` as HOME.
pub fn offline(
    command: &str,
    aws_endpoint: &str,
    config: &std::path::Path,
    home: &std::path::Path,
) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ca-asg-provider"));
    cmd.args([command, "--aws-endpoint", aws_endpoint, "--config"])
        .arg(config)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", home.join("none"))
        .env("AWS_SHARED_CREDENTIALS_FILE", home.join("none"))
        .env("HOME", home)
        .env_remove("AWS_ROLE_ARN")
        .env_remove("AWS_WEB_IDENTITY_TOKEN_FILE")
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST");
    cmd
}

/// Runs `cmd` and prints what it said under `label`: its exit code, and its stdout
/// then its stderr.
pub fn said(cmd: &mut Command, label: &str) -> (Option<i32>, String) {
    let out = cmd.output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("== {label}\n{text}");
    (out.status.code(), text)
}
