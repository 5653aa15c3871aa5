//! `check-config`: validate the configuration, read AWS, and print each group, its
//! bounds, its template and every problem; then ask the API server (one
//! SelfSubjectAccessReview per permission) whether the service may do what the drain
//! needs, and print what is missing. Exit 0 when all is well, 1 when AWS, a group or a
//! permission has a problem, 2 when the configuration itself is invalid.

use std::process::ExitCode;

use prost::Message;

use crate::config::ConfigArgs;
use crate::provider::template;
use crate::provider::Provider;

pub async fn run(args: ConfigArgs) -> ExitCode {
    let mut cfg = match args.load() {
        Ok(c) => c,
        Err(e) => {
            println!("configuration: INVALID\n{e}");
            return ExitCode::from(2);
        }
    };
    println!("configuration: ok ({})", cfg.source);
    println!("  listen:           {}", cfg.listen);
    match crate::cloud::aws::resolve_region(&cfg.aws_settings()).await {
        Ok(r) => cfg.set_region(r),
        Err(e) => {
            println!("region: MISSING\n  {e}");
            return ExitCode::from(2);
        }
    }
    println!("  region:           {}", cfg.region);
    if let Some(e) = &cfg.aws_endpoint {
        println!("  aws endpoint:     {e}");
    }
    println!(
        "  refresh interval: {}",
        crate::duration::format_duration(cfg.provider.refresh_interval)
    );
    println!(
        "  refresh wait:     {} (must stay below CA's grpc_timeout, caCallTimeout)",
        crate::duration::format_duration(cfg.provider.refresh_wait)
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
    let cloud = crate::cloud::aws::connect(&cfg.aws_settings()).await;
    let provider = Provider::new(cloud, cfg.provider.clone());
    // With queue mode, lifecycle actions arrive through the queue within a receive
    // wait; the slow safety-net poll is not what a hook's timeout must outlast.
    let mut scale_in = cfg.scale_in.clone();
    if cfg.interruption.queue_url.is_some() {
        scale_in.lifecycle_poll_interval = cfg.interruption.wait;
    }
    let aws_ok = report(&provider, &scale_in).await == ExitCode::SUCCESS;
    let queue_ok = match &cfg.interruption.queue_url {
        Some(url) => {
            let queue = crate::cloud::aws::sqs::SqsQueue::new(&cfg.aws_settings(), url).await;
            queue_report(&queue, url, &cfg.interruption).await
        }
        None => true,
    };
    let kube_ok = if cfg.drain_enabled {
        match crate::scalein::kube_client().await {
            Ok(client) => {
                let ns = cfg
                    .scale_in
                    .lease_namespace
                    .clone()
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_else(|| "kube-system".into());
                kube_report(client, &ns, &cfg.scale_in.lease_name).await
            }
            Err(e) => {
                println!(
                    "
Kubernetes: permissions not checked: {e:#}"
                );
                true
            }
        }
    } else {
        true
    };
    if aws_ok && kube_ok && queue_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Prints the Kubernetes permissions table. True when every permission is held.
pub async fn kube_report(client: kube::Client, lease_namespace: &str, lease_name: &str) -> bool {
    let checked = match tokio::time::timeout(
        std::time::Duration::from_secs(20),
        crate::scalein::permissions::check(client, lease_namespace, lease_name),
    )
    .await
    {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            println!(
                "
Kubernetes: FAILED to check permissions: {e}"
            );
            return false;
        }
        Err(_) => {
            println!(
                "
Kubernetes: FAILED to check permissions: no answer within 20 s"
            );
            return false;
        }
    };
    println!(
        "
Kubernetes permissions (SelfSubjectAccessReview):"
    );
    println!(
        "  {:<8} {:<20} {:<18} {:<8} needed for",
        "verb", "group", "resource", "allowed"
    );
    for c in &checked {
        let p = c.permission;
        println!(
            "  {:<8} {:<20} {:<18} {:<8} {}",
            p.verb,
            if p.group.is_empty() { "\"\"" } else { p.group },
            p.resource,
            if c.allowed { "yes" } else { "NO" },
            p.why
        );
    }
    let missing: Vec<_> = checked.iter().filter(|c| !c.allowed).collect();
    if missing.is_empty() {
        println!("  all {} permissions held", checked.len());
        true
    } else {
        println!(
            "  missing {} of {}: apply deploy/base/rbac.yaml (ClusterRole and Role ca-asg-provider) to this ServiceAccount",
            missing.len(),
            checked.len()
        );
        false
    }
}

/// Reads AWS through `provider` and prints what it found; shared with tests.
pub async fn report(
    provider: &std::sync::Arc<Provider>,
    scale_in: &crate::scalein::ScaleInSettings,
) -> ExitCode {
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
        let ours = g.hooks.iter().find(|h| h.name == scale_in.hook_name);
        let mode = match ours {
            None => format!(
                "direct (no EC2_INSTANCE_TERMINATING hook named {})",
                scale_in.hook_name
            ),
            Some(h) => format!(
                "lifecycle hook {} (heartbeat timeout {}s)",
                h.name, h.heartbeat_timeout_secs
            ),
        };
        println!("    scale-in: {mode}");
        let opts = crate::provider::options::overlay_from_tags(&Default::default(), &g.asg.tags);
        println!(
            "    autoscaling options: {}",
            if opts.applied == 0 {
                "none set by tags (GetOptions answers Unimplemented: CA's defaults)".to_string()
            } else {
                format!("{} set by tags", opts.applied)
            }
        );
        problems.extend(
            opts.warnings
                .into_iter()
                .map(|w| format!("group {}: {w}", g.asg.name)),
        );
        problems.extend(hook_problems(
            &g.asg.name,
            &g.hooks,
            &scale_in.hook_name,
            scale_in.lifecycle_poll_interval,
        ));
        for w in &g.warnings {
            problems.push(w.clone());
        }
        match provider.template_node(&g.asg.name).await {
            Ok(bytes) => match k8s_pb::api::core::v1::Node::decode(bytes.as_ref()) {
                Ok(node) => print!("{}", template::describe(&node)),
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

/// Queue mode: whether the queue answers, and what waits in it.
pub async fn queue_report(
    queue: &crate::cloud::aws::sqs::SqsQueue,
    url: &str,
    settings: &crate::interruption::InterruptionSettings,
) -> bool {
    println!("\ninterruption queue: {url}");
    let ok = match queue.waiting().await {
        Ok(n) => {
            println!("  reachable (sqs:GetQueueAttributes), {n} message(s) waiting");
            if n > 100 {
                println!("  warning: messages pile up; nothing may be consuming them (this service consumes only on the leader, and only in serve)");
            }
            true
        }
        Err(e) => {
            println!("  NOT reachable: {e}");
            false
        }
    };
    println!(
        "  rebalance recommendations: {:?}; instances of unmanaged groups: {}",
        settings.rebalance,
        if settings.unmanaged {
            "drained"
        } else {
            "ignored"
        }
    );
    println!("  EventBridge rules are not read here: deploy/aws/interruption-queue.yaml creates the five this mode needs. NTH's queue processor on the same queue would take half of the messages: give NTH its own queue or turn it off (README \"Queue mode\").");
    ok
}

/// What is wrong with a group's terminating hooks, for this service's drain. Pure.
pub fn hook_problems(
    group: &str,
    hooks: &[crate::cloud::LifecycleHook],
    ours: &str,
    poll: std::time::Duration,
) -> Vec<String> {
    let mut out = Vec::new();
    for h in hooks {
        if h.name != ours {
            out.push(format!(
                "group {group}: another EC2_INSTANCE_TERMINATING hook {:?} (NTH's or another tool's): this service completes only {ours:?}, and two drainers end each instance when the first of them is done; remove one",
                h.name
            ));
        } else if u64::try_from(h.heartbeat_timeout_secs).unwrap_or(0) <= poll.as_secs() {
            out.push(format!(
                "group {group}: hook {ours:?} times out after {}s, not longer than scaleIn.lifecyclePollInterval {}s: an instance can expire before the scan finds it; lower the poll interval or raise the hook's timeout",
                h.heartbeat_timeout_secs,
                poll.as_secs()
            ));
        }
    }
    out
}
