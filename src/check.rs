//! `check-config`: validate the configuration, read AWS, and print each group, its
//! bounds, its template and every problem. Exit 0 when all is well, 1 when AWS or a
//! group has a problem, 2 when the configuration itself is invalid.

use std::process::ExitCode;

use prost::Message;

use crate::cli::ConfigArgs;
use crate::provider::Provider;

pub async fn run(args: ConfigArgs) -> ExitCode {
    let cfg = match args.load() {
        Ok(c) => c,
        Err(e) => {
            println!("configuration: INVALID\n{e}");
            return ExitCode::from(2);
        }
    };
    println!("configuration: ok ({})", cfg.source);
    println!("  listen:           {}", cfg.listen);
    println!("  region:           {}", cfg.region);
    if let Some(e) = &cfg.aws_endpoint {
        println!("  aws endpoint:     {e}");
    }
    println!(
        "  refresh interval: {}",
        crate::duration::format_duration(cfg.provider.refresh_interval)
    );
    for n in &cfg.provider.selector.names {
        println!("  static group:     {n}");
    }
    for set in &cfg.provider.selector.tag_sets {
        let terms: Vec<String> = set
            .iter()
            .map(|t| match &t.value {
                Some(v) => format!("{}={v}", t.key),
                None => t.key.clone(),
            })
            .collect();
        println!("  discovery:        asg:tag={}", terms.join(","));
    }
    if let Err(e) = cfg.require_groups() {
        println!("{e}");
        return ExitCode::from(2);
    }
    let cloud = match crate::cli::aws_cloud(&cfg).await {
        Ok(c) => c,
        Err(e) => {
            println!("AWS: cannot set up the client: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let provider = Provider::new(cloud, cfg.provider.clone());
    report(&provider).await
}

/// Reads AWS through `provider` and prints what it found; shared with tests.
pub async fn report(provider: &std::sync::Arc<Provider>) -> ExitCode {
    let mut problems: Vec<String> = Vec::new();
    if let Err(e) = provider.refresh_now().await {
        println!("AWS: FAILED to read Auto Scaling Groups: {e}");
        return ExitCode::FAILURE;
    }
    let reg = provider.registry();
    println!("\nnode groups found: {}", reg.groups.len());
    for name in &provider.settings().selector.names {
        if reg.group(name).is_none() {
            problems.push(format!(
                "static group {name}: no such Auto Scaling Group in AWS"
            ));
        }
    }
    for g in &reg.groups {
        println!(
            "\n- {}\n    bounds: min {} max {} (ASG: min {} max {}), desired {}, instances {}",
            g.asg.name,
            g.min,
            g.max,
            g.asg.min_size,
            g.asg.max_size,
            g.asg.desired_capacity,
            g.asg.instances.len()
        );
        let mode = if g.hooks.is_empty() {
            "direct (no EC2_INSTANCE_TERMINATING hook)".to_string()
        } else {
            format!(
                "lifecycle hook {} (heartbeat timeout {}s)",
                g.hooks[0].name, g.hooks[0].heartbeat_timeout_secs
            )
        };
        println!("    scale-in: {mode}");
        for w in &g.warnings {
            problems.push(w.clone());
        }
        match provider.template_node(&g.asg.name).await {
            Ok(bytes) => match k8s_pb::api::core::v1::Node::decode(bytes.as_ref()) {
                Ok(node) => print_template(&node),
                Err(e) => problems.push(format!(
                    "group {}: template does not decode: {e}",
                    g.asg.name
                )),
            },
            Err(e) => problems.push(format!("group {}: no template node: {e}", g.asg.name)),
        }
    }
    if problems.is_empty() {
        println!("\nno problems found");
        ExitCode::SUCCESS
    } else {
        println!("\nproblems ({}):", problems.len());
        for p in &problems {
            println!("  - {p}");
        }
        ExitCode::FAILURE
    }
}

pub fn print_template(node: &k8s_pb::api::core::v1::Node) {
    let labels = node
        .metadata
        .as_ref()
        .map(|m| m.labels.clone())
        .unwrap_or_default();
    let mut keys: Vec<_> = labels.iter().collect();
    keys.sort();
    println!("    template labels:");
    for (k, v) in keys {
        println!("      {k}={v}");
    }
    if let Some(spec) = &node.spec {
        for t in &spec.taints {
            println!(
                "    template taint: {}={}:{}",
                t.key.as_deref().unwrap_or(""),
                t.value.as_deref().unwrap_or(""),
                t.effect.as_deref().unwrap_or("")
            );
        }
    }
    if let Some(status) = &node.status {
        let q = |m: &std::collections::BTreeMap<
            String,
            k8s_pb::apimachinery::pkg::api::resource::Quantity,
        >| {
            let mut v: Vec<String> = m
                .iter()
                .map(|(k, q)| format!("{k}={}", q.string.as_deref().unwrap_or("?")))
                .collect();
            v.sort();
            v.join(" ")
        };
        println!("    capacity:    {}", q(&status.capacity));
        println!("    allocatable: {}", q(&status.allocatable));
    }
}
