//! The EKS quickstart (docs/quickstart-eks.md), followed where it can be here: the chart renders the
//! quickstart's values file with the cluster's name put in, as step 6's sed does (the
//! chart refuses the file's placeholder `my-cluster`; tests/deploy/validate.py runs
//! that sed itself and validates the result), and
//! `check-config` on the configuration that render puts in the ConfigMap finds the
//! cluster's tagged ASG (moto standing in for AWS) and exits 0, printing what step 7's
//! sample output shows, as the quickstart says it does when the install is right.

use std::process::Command;

use aws_sdk_autoscaling as asg;

mod support;
use support::moto::MotoServer;

fn root() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The cluster's name the quickstart's sed puts in place of `my-cluster`.
const CLUSTER: &str = "prod-blue";

/// The `config.yaml` of the ConfigMap the chart renders from the quickstart values,
/// with [`CLUSTER`] and a system node group in place of the placeholders
/// (docs/quickstart-eks.md step 6: `s/my-cluster/$CLUSTER/g`, `s/my-system-nodegroup/$SYSTEM_NODEGROUP/`).
fn rendered_config() -> String {
    let helm = root().join(".venv/bin/helm");
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("my-values.yaml");
    let example =
        std::fs::read_to_string(root().join("deploy/chart/examples/quickstart-values.yaml"))
            .unwrap();
    let filled = example
        .replace("my-cluster", CLUSTER)
        .replace("my-system-nodegroup", "system");
    std::fs::write(&values, filled).unwrap();
    let out = Command::new(&helm)
        .current_dir(root())
        .args([
            "template",
            "ca-asg-provider",
            "deploy/chart",
            "-n",
            "kube-system",
            "-f",
        ])
        .arg(&values)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); scripts/test.sh installs helm into .venv",
                helm.display()
            )
        });
    assert!(
        out.status.success(),
        "helm template failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for doc in text.split("\n---") {
        let Ok(v) = serde_saphyr::from_str::<serde_json::Value>(doc) else {
            continue;
        };
        if v["kind"] == "ConfigMap" {
            if let Some(c) = v["data"]["config.yaml"].as_str() {
                return c.to_string();
            }
        }
    }
    panic!("no ConfigMap with config.yaml in the quickstart render:\n{text}");
}

#[tokio::test]
async fn check_config_on_the_quickstart_render_finds_the_clusters_groups() {
    let config = rendered_config();
    assert!(config.contains("eu-west-1"), "{config}");
    let moto = MotoServer::start();
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("eu-west-1"))
        .endpoint_url(&moto.url)
        .credentials_provider(aws_sdk_autoscaling::config::Credentials::new(
            "test", "test", None, None, "test",
        ))
        .load()
        .await;
    support::moto::launch_template(&sdk, "workers").await;
    let tag = |k: &str| {
        asg::types::Tag::builder()
            .resource_id(format!("{CLUSTER}-workers"))
            .resource_type("auto-scaling-group")
            .key(k)
            .value("true")
            .propagate_at_launch(true)
            .build()
    };
    asg::Client::new(&sdk)
        .create_auto_scaling_group()
        .auto_scaling_group_name(format!("{CLUSTER}-workers"))
        .min_size(0)
        .max_size(5)
        .desired_capacity(0)
        .availability_zones("eu-west-1a")
        .launch_template(
            asg::types::LaunchTemplateSpecification::builder()
                .launch_template_name("workers")
                .version("$Default")
                .build(),
        )
        .tags(tag("k8s.io/cluster-autoscaler/enabled"))
        .tags(tag(&format!("k8s.io/cluster-autoscaler/{CLUSTER}")))
        .send()
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, &config).unwrap();
    // Outside a cluster: the permissions are reported as not checked.
    let out = support::moto::offline("check-config", &moto.url, &path, dir.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    assert_eq!(out.status.code(), Some(0), "{text}");
    for line in [
        "configuration: ok".to_string(),
        "region:           eu-west-1".to_string(),
        format!("asg:tag=k8s.io/cluster-autoscaler/enabled,k8s.io/cluster-autoscaler/{CLUSTER}"),
        format!("{CLUSTER}-workers"),
    ] {
        assert!(text.contains(&line), "missing {line:?} in:\n{text}");
    }
    // Step 7's sample output is this output, line by line, down to "no problems found"
    // (moto's endpoint line aside: the quickstart sets none; the file is where the pod
    // mounts it).
    let stdout = String::from_utf8_lossy(&out.stdout).replace(
        &path.display().to_string(),
        "/etc/ca-asg-provider/config/config.yaml",
    );
    let got: Vec<&str> = stdout
        .lines()
        .filter(|l| !l.starts_with("  aws endpoint:"))
        .take_while(|l| *l != "no problems found")
        .collect();
    let doc = step7_sample();
    let want: Vec<&str> = doc
        .lines()
        .take_while(|l| *l != "no problems found")
        .collect();
    if let Err(e) = sample_matches(&want, &got) {
        panic!("docs/quickstart-eks.md step 7's sample output differs from check-config's: {e}\nsample:\n{}\nreal:\n{}", want.join("\n"), got.join("\n"));
    }
    assert!(doc.contains("\nno problems found\n"), "{doc}");
    let n = ca_asg_provider::scalein::kube::permissions::REQUIRED.len();
    assert!(
        doc.contains(&format!("  all {n} permissions held")),
        "step 7's sample must say all {n} permissions held:\n{doc}"
    );
}

/// The code block of step 7 of docs/quickstart-eks.md that begins with "configuration: ok".
fn step7_sample() -> String {
    let md = std::fs::read_to_string(root().join("docs/quickstart-eks.md")).unwrap();
    let step = &md[md
        .find("**7. Check.**")
        .expect("no step 7 in docs/quickstart-eks.md")..];
    let start = step
        .find("\n```\nconfiguration: ok")
        .expect("no sample output in step 7")
        + 5;
    let end = start + step[start..].find("\n```").unwrap();
    step[start..end].to_string()
}

/// Whether real lines match a sample's: `<...>` stands for a value, `...` for the rest of
/// a line, and a line ending in `(one line per ...)` for one or more lines of its shape.
fn sample_matches(sample: &[&str], real: &[&str]) -> Result<(), String> {
    /// A sample line as pieces: text, or a wildcard of at least `min` characters.
    enum Piece<'a> {
        Text(&'a str),
        Any { min: usize },
    }
    fn pieces(line: &str) -> Vec<Piece<'_>> {
        let mut out = Vec::new();
        let mut rest = line;
        while !rest.is_empty() {
            let lt = rest.find('<').filter(|&at| rest[at..].contains('>'));
            let dots = rest.find("...");
            let next = match (lt, dots) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let Some(at) = next else {
                out.push(Piece::Text(rest));
                break;
            };
            if at > 0 {
                out.push(Piece::Text(&rest[..at]));
            }
            if rest[at..].starts_with("...") {
                out.push(Piece::Any { min: 0 });
                rest = &rest[at + 3..];
            } else {
                out.push(Piece::Any { min: 1 });
                rest = &rest[at + rest[at..].find('>').unwrap() + 1..];
            }
        }
        out
    }
    fn matches(p: &[Piece], s: &str) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((Piece::Text(t), rest)) => s.strip_prefix(t).is_some_and(|s| matches(rest, s)),
            Some((Piece::Any { min }, rest)) => s
                .char_indices()
                .map(|(i, _)| i)
                .chain([s.len()])
                .filter(|&i| i >= *min)
                .any(|i| matches(rest, &s[i..])),
        }
    }
    let mut i = 0;
    for line in sample {
        let (shape, many) = match line.find("(one line per") {
            Some(at) => (line[..at].trim_end(), true),
            None => (*line, false),
        };
        let p = pieces(shape);
        let Some(r) = real.get(i) else {
            return Err(format!("the real output ends before {line:?}"));
        };
        if !matches(&p, r) {
            return Err(format!("line {}: {r:?} does not match {line:?}", i + 1));
        }
        i += 1;
        while many && real.get(i).is_some_and(|r| matches(&p, r)) {
            i += 1;
        }
    }
    match real.get(i) {
        None => Ok(()),
        Some(r) => Err(format!("line {}: {r:?} is not in the sample", i + 1)),
    }
}
