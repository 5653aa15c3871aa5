//! `check-config`: validate the configuration, read AWS, and print each group, its
//! bounds, its template and every problem; then ask the API server (one
//! SelfSubjectAccessReview per permission) whether the service may do what the drain
//! needs, and print what is missing. Exit 0 when all is well, 1 when AWS, a group or a
//! permission has a problem (finding no group at all is one), 2 when the
//! configuration itself is invalid.

use std::process::ExitCode;

use prost::Message;

use crate::config::ConfigArgs;
use crate::provider::template;
use crate::provider::Provider;
use crate::scalein::kube::user_agent::{named, CHECK_CONFIG};

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
    // Before any call: a region AWS cannot have is a host name that does not resolve,
    // and the answer would name only DNS.
    if let Err(e) = crate::cloud::aws::region::partition_of(&cfg.region) {
        println!("region: INVALID\n  {e}");
        return ExitCode::from(2);
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
        let terms: Vec<String> = set.iter().map(|t| t.to_string()).collect();
        println!("  discovery:        asg:tag={}", terms.join(","));
    }
    for b in cfg.scale_in.budgets_in_order() {
        println!("  budget:           {}", b.said());
    }
    println!("  never budgeted:   spot interruptions, scheduled events with a deadline, stopped instances (the instance ends anyway)");
    for line in cfg.scale_in.deadlines_said() {
        println!("  {line}");
    }
    let lb = &cfg.scale_in.load_balancers;
    if lb.enabled {
        println!(
            "  load balancers:   an instance ends once out of every ELBv2 target group that has it, each waited at most its deregistration delay + {}{}",
            crate::duration::format_duration(lb.margin),
            if lb.deregister {
                "; first deregistered from the target groups attached to its group"
            } else {
                ""
            }
        );
    } else {
        println!("  load balancers:   not waited for (scaleIn.loadBalancers.waitForDeregistration: false)");
    }
    if let Err(e) = cfg.require_groups() {
        println!("{e}");
        return ExitCode::from(2);
    }
    let cloud = crate::cloud::aws::connect(&cfg.aws_settings()).await;
    let provider = Provider::new(cloud.clone(), cfg.provider.clone());
    // With queue mode, lifecycle actions arrive through the queue within a receive
    // wait; the slow safety-net poll is not what a hook's timeout must outlast.
    let mut scale_in = cfg.scale_in.clone();
    if cfg.interruption.queue_url.is_some() {
        scale_in.lifecycle_poll_interval = cfg.interruption.wait;
    }
    let looked_in = LookedIn {
        region: cfg.region.clone(),
        account: account_of_role_arn(std::env::var("AWS_ROLE_ARN").ok().as_deref()),
    };
    let aws_ok = report_in(&provider, &scale_in, &looked_in).await == ExitCode::SUCCESS;
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
                let zonal_ok = zonal_report(client.clone(), &provider).await.is_some();
                let pool_ok = pool_report(client.clone(), cloud.as_ref(), &provider)
                    .await
                    .is_some();
                let ns = cfg
                    .scale_in
                    .lease_namespace
                    .clone()
                    .or_else(|| std::env::var("POD_NAMESPACE").ok())
                    .unwrap_or_else(|| "kube-system".into());
                kube_report(client, &ns, &cfg.scale_in.lease_name).await && zonal_ok && pool_ok
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
    let client = named(client, CHECK_CONFIG);
    let checked = match tokio::time::timeout(
        std::time::Duration::from_secs(20),
        crate::scalein::kube::permissions::check(client, lease_namespace, lease_name),
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
            "  missing {} of {}: bind the ClusterRole and Role ca-asg-provider to this ServiceAccount: {}",
            missing.len(),
            checked.len(),
            crate::scalein::kube::permissions::HOW_TO_GRANT
        );
        false
    }
}

/// An AWS failure as one sentence: the operation, what AWS (or the way to it) said,
/// and what to check. The one place check-config renders an AWS error.
pub fn aws_sentence(e: &crate::cloud::CloudError) -> String {
    use crate::cloud::CloudError;
    match e {
        CloudError::Throttled { operation, message } => format!(
            "AWS throttled {operation} ({message}); this passes: run check-config again, and if it persists, look for what else calls AWS in this account and region"
        ),
        CloudError::Transient { operation, message } if message.starts_with("could not send") => format!(
            "AWS {operation} {message}; check the region (aws.region, --region, AWS_REGION), that this machine reaches AWS's endpoint for it (DNS, a proxy, a VPC endpoint), and aws.endpoint if one is set"
        ),
        CloudError::Transient { operation, message } => format!(
            "AWS {operation} failed for a moment ({message}); run check-config again"
        ),
        CloudError::Credentials { .. } => e.to_string(),
        CloudError::NotFound { .. } => format!("{e}; check the name and the region"),
        CloudError::Rejected {
            operation,
            code,
            message,
        } if code.contains("AccessDenied") || code == "UnauthorizedOperation" => format!(
            "AWS refused {operation} ({code}: {message}); check the IAM policy of the role the service runs as (deploy/iam-policy.json grants every call it makes)"
        ),
        CloudError::Rejected {
            operation,
            code,
            message,
        } => format!(
            "AWS refused {operation} ({code}: {message}); check the configuration values the call was made with"
        ),
    }
}

/// Where check-config looked for Auto Scaling Groups, for the "nothing found" problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookedIn {
    pub region: String,
    /// The AWS account, when it is known without a call (IRSA's role ARN names it).
    pub account: Option<String>,
}

impl Default for LookedIn {
    fn default() -> Self {
        Self {
            region: "(region not given)".into(),
            account: None,
        }
    }
}

/// The account of an IAM role ARN (`arn:aws:iam::111122223333:role/x`, IRSA's
/// AWS_ROLE_ARN): check-config names the account without an STS call, which the
/// least-privilege policy does not grant. Pure.
pub fn account_of_role_arn(arn: Option<&str>) -> Option<String> {
    let mut parts = arn?.split(':');
    let (Some("arn"), Some(_partition), Some("iam"), Some(""), Some(account)) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    (account.len() == 12 && account.bytes().all(|b| b.is_ascii_digit()))
        .then(|| account.to_string())
}

/// The problem check-config reports when the selector found no group: what it looked
/// for, where, and what to check. Pure.
pub fn nothing_found(selector: &crate::cloud::GroupSelector, looked_in: &LookedIn) -> String {
    let account = match &looked_in.account {
        Some(a) => format!("account {a} (from AWS_ROLE_ARN)"),
        None => "account unknown (no STS call is made; `aws sts get-caller-identity` with the same credentials names it)".into(),
    };
    format!(
        "no node group found: no Auto Scaling Group is {} in region {}, {account}. CA would have nothing to scale: check the cluster name in the discovery tags (the chart's clusterName, or config.autoDiscovery), that the ASGs carry every tag of the set, the static names (config.nodeGroups) and the region (aws.region, AWS_REGION)",
        crate::provider::looked_for(selector),
        looked_in.region
    )
}

/// The tag every discovery set of CA's names first.
pub const ENABLED_TAG: &str = "k8s.io/cluster-autoscaler/enabled";
const CLUSTER_TAG_PREFIX: &str = "k8s.io/cluster-autoscaler/";

/// The cluster tags (`k8s.io/cluster-autoscaler/<cluster>`) on `groups`, each with
/// how many groups carry it, sorted by tag. Pure.
pub fn cluster_tags_seen(groups: &[crate::cloud::AsgSnapshot]) -> Vec<(String, usize)> {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    for g in groups {
        for key in g.tags.keys() {
            let Some(cluster) = key.strip_prefix(CLUSTER_TAG_PREFIX) else {
                continue;
            };
            if key != ENABLED_TAG && !cluster.is_empty() && !cluster.contains('/') {
                *seen.entry(key.clone()).or_default() += 1;
            }
        }
    }
    seen.into_iter().collect()
}

/// The "did you mean" of a discovery that found nothing: the cluster tags on the
/// groups that carry the enabled tag, in words. Pure.
pub fn cluster_tags_sentence(enabled: usize, seen: &[(String, usize)]) -> String {
    let groups = |n: usize| {
        if n == 1 {
            "1 group".to_string()
        } else {
            format!("{n} groups")
        }
    };
    if enabled == 0 {
        return format!("No Auto Scaling Group in this region carries {ENABLED_TAG}");
    }
    if seen.is_empty() {
        return format!(
            "Did you mean: {} carry {ENABLED_TAG}, with no cluster tag ({CLUSTER_TAG_PREFIX}<cluster>)",
            groups(enabled)
        );
    }
    let each: Vec<String> = seen
        .iter()
        .map(|(tag, n)| format!("{tag} ({})", groups(*n)))
        .collect();
    format!(
        "Did you mean: the groups tagged {ENABLED_TAG} here carry the cluster tags {}",
        each.join(", ")
    )
}

/// When discovery looked for the enabled tag and found nothing: one more read (the
/// groups with the enabled tag alone) to say which cluster tags exist. `None` when
/// discovery does not use the enabled tag, or the read fails (the problem stands
/// without it).
async fn did_you_mean(provider: &Provider) -> Option<String> {
    use crate::cloud::{GroupSelector, TagFilter};
    let uses_enabled = provider
        .settings()
        .selector
        .tag_sets
        .iter()
        .any(|set| set.iter().any(|t| t.key == ENABLED_TAG));
    if !uses_enabled {
        return None;
    }
    let selector = GroupSelector {
        names: vec![],
        tag_sets: vec![vec![TagFilter {
            key: ENABLED_TAG.into(),
            value: None,
        }]],
    };
    let groups = provider.cloud().describe_groups(&selector).await.ok()?;
    Some(cluster_tags_sentence(
        groups.len(),
        &cluster_tags_seen(&groups),
    ))
}

/// Reads AWS through `provider` and prints what it found; shared with tests.
pub async fn report(
    provider: &std::sync::Arc<Provider>,
    scale_in: &crate::scalein::ScaleInSettings,
) -> ExitCode {
    report_in(provider, scale_in, &LookedIn::default()).await
}

/// [`report`], naming the region and account it looked in when nothing is found.
pub async fn report_in(
    provider: &std::sync::Arc<Provider>,
    scale_in: &crate::scalein::ScaleInSettings,
    looked_in: &LookedIn,
) -> ExitCode {
    let mut problems: Vec<String> = Vec::new();
    if let Err(e) = provider.refresh_now().await {
        let said = match &e {
            crate::provider::ProviderError::Cloud(c) => aws_sentence(c),
            other => other.to_string(),
        };
        println!("AWS: FAILED to read Auto Scaling Groups: {said}");
        return ExitCode::FAILURE;
    }
    let reg = provider.registry();
    println!("\nnode groups found: {}", reg.groups.len());
    if reg.groups.is_empty() {
        let mut problem = nothing_found(&provider.settings().selector, looked_in);
        if let Some(hint) = did_you_mean(provider).await {
            problem.push_str(". ");
            problem.push_str(&hint);
        }
        problems.push(problem);
    }
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
        for note in hook_notes(&g.asg.name, &g.asg.tags, &g.hooks, &scale_in.hook_name) {
            println!("    note: {note}");
        }
        let hooked = scale_in.create_hook || g.hooks.iter().any(|h| h.name == scale_in.hook_name);
        let (pool, pool_problems) =
            warm_pool_findings(&g.asg.name, g.asg.warm_pool.as_ref(), hooked);
        if let Some(line) = pool {
            println!("    {line}");
        }
        problems.extend(pool_problems);
        problems.extend(hook_problems(
            &g.asg.name,
            &g.asg.tags,
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
        problems.extend(template_problems(
            &g.asg.name,
            provider.template_findings(&g.asg.name).as_ref(),
        ));
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

/// What check-config counts as problems of a group's template: each part built from
/// missing or expired data (a DescribeNodegroup that failed, a launch template that
/// could not be re-read) and every tag, flag or user-data setting that could not be
/// used, named with its value. Pure.
pub fn template_problems(
    group: &str,
    findings: Option<&crate::provider::templates::TemplateFindings>,
) -> Vec<String> {
    let Some(f) = findings else {
        return Vec::new();
    };
    let mut out: Vec<String> = f
        .incomplete
        .iter()
        .filter(|(part, _)| {
            use crate::provider::templates::Part;
            // The warnings below name each unusable setting on its own line.
            !matches!(part, Part::UserData | Part::Tags)
        })
        .map(|(part, why)| {
            format!(
                "group {group}: template node built from incomplete data ({}): {why}",
                part.as_str()
            )
        })
        .collect();
    out.extend(f.warnings.iter().map(|w| {
        if w.starts_with("group ") {
            format!("template node: {w}")
        } else {
            format!("group {group}: template node: {w}")
        }
    }));
    out
}

/// Queue mode: whether the queue answers, and what waits in it.
pub async fn queue_report(
    queue: &crate::cloud::aws::sqs::SqsQueue,
    url: &str,
    settings: &crate::scalein::settings::InterruptionSettings,
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
            println!("  NOT reachable: {}", aws_sentence(&e));
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
    println!("  EventBridge rules are not read here: deploy/aws/interruption-queue.yaml creates the five this mode needs. NTH's queue processor on the same queue would take half of the messages: give NTH its own queue or turn it off (docs/queue-mode.md).");
    ok
}

/// What is wrong with a group's terminating hooks, for this service's drain: a second
/// drainer (EKS's own hook on a managed node group is none: [`hook_notes`]), our hook
/// named as EKS's on a managed node group, a timeout shorter than the poll. Pure.
pub fn hook_problems(
    group: &str,
    tags: &std::collections::BTreeMap<String, String>,
    hooks: &[crate::cloud::LifecycleHook],
    ours: &str,
    poll: std::time::Duration,
) -> Vec<String> {
    use crate::scalein::decide::hooks::{self, HookOwner};
    let mut out = Vec::new();
    for h in hooks {
        match hooks::owner(&h.name, ours, tags) {
            HookOwner::Eks => continue,
            HookOwner::Other => {
                out.push(format!(
                    "group {group}: another EC2_INSTANCE_TERMINATING hook {:?} (NTH's or another tool's){}: this service completes only {ours:?}, and two drainers end each instance when the first of them is done; remove one",
                    h.name,
                    hooks::named_like_eks(&h.name, tags)
                ));
                continue;
            }
            HookOwner::Ours => {}
        }
        if h.name == hooks::EKS_TERMINATE_HOOK && hooks::is_eks_managed(tags) {
            out.push(format!(
                "group {group}: scaleIn.hookName {ours:?} is the name of EKS's own hook on this {}: this service would heartbeat and complete EKS's lifecycle actions; give this service's hook another name",
                hooks::managed_node_group(tags)
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

/// What `check-config` explains about a group's hooks without counting it a problem:
/// EKS's own hook on a managed node group, beside this service's hook or without it.
/// Pure.
pub fn hook_notes(
    group: &str,
    tags: &std::collections::BTreeMap<String, String>,
    hooks: &[crate::cloud::LifecycleHook],
    ours: &str,
) -> Vec<String> {
    use crate::scalein::decide::hooks::{self, HookOwner};
    let with_ours = hooks.iter().any(|h| h.name == ours);
    hooks
        .iter()
        .filter(|h| hooks::owner(&h.name, ours, tags) == HookOwner::Eks)
        .map(|_| hooks::eks_hook_explained(group, tags, ours, with_ours))
        .collect()
}

/// What `check-config` says of a group's warm pool: the line it prints, and the
/// problems. An instance the ASG returns to the pool (reuse on scale-in) waits for
/// the EC2_INSTANCE_TERMINATING hooks in `Warmed:Pending:Wait`: with our hook on the
/// group (`hooked`: there, or created by `serve`) it is drained there and its Node
/// handed back when it leaves the pool; without it nothing drains it, and it stops
/// with its pods on it, which is a problem. Pure.
pub fn warm_pool_findings(
    group: &str,
    pool: Option<&crate::cloud::WarmPool>,
    hooked: bool,
) -> (Option<String>, Vec<String>) {
    let Some(p) = pool else {
        return (None, Vec::new());
    };
    let max = match p.max_prepared {
        Some(m) => m.to_string(),
        None => "the group's max size".to_string(),
    };
    let reuse = match (p.reuse_on_scale_in, hooked) {
        (false, _) => "no",
        (true, true) => "yes (drained through our hook in Warmed:Pending:Wait; the node is handed back when the instance leaves the pool)",
        (true, false) => "yes",
    };
    let line = format!(
        "warm pool: {}, min {}, max prepared {max}, reuse on scale-in {reuse}",
        p.pool_state, p.min_size,
    );
    let mut problems = Vec::new();
    if p.reuse_on_scale_in && !hooked {
        problems.push(format!(
            "group {group}: its warm pool reuses instances on scale-in (InstanceReusePolicy ReuseOnScaleIn) and the group has no EC2_INSTANCE_TERMINATING hook of ours: an instance the ASG sends back to the pool waits in Warmed:Pending:Wait with nothing to drain it, and stops with its pods on it; add our hook (scaleIn.createLifecycleHook: true, or aws autoscaling put-lifecycle-hook) or turn reuse off (aws autoscaling put-warm-pool --auto-scaling-group-name {group} --instance-reuse-policy ReuseOnScaleIn=false) (docs/node-groups.md)"
        ));
    }
    (Some(line), problems)
}

/// Node labels that name a zone: a topology spread over any of them is zonal.
pub const ZONE_KEYS: &[&str] = &[
    "topology.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.ebs.csi.aws.com/zone",
    "topology.k8s.aws/zone-id",
];

/// Provisioners whose volumes live in one zone (EBS).
pub const ZONAL_PROVISIONERS: &[&str] = &["ebs.csi.aws.com", "kubernetes.io/aws-ebs"];

/// Pods that pin themselves to zones, by `namespace/name`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ZonalUse {
    /// A topology spread over a zone key with `whenUnsatisfiable: DoNotSchedule`.
    pub spread: Vec<String>,
    /// A claim on a zonal (EBS) volume, or on a claim that could not be read.
    pub volumes: Vec<String>,
}

/// The claims a pod uses, as (namespace, claim name): `persistentVolumeClaim`
/// volumes and generic ephemeral volumes (`<pod>-<volume>`). Pure.
pub fn pod_claims(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<(String, String)> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(c) = &v.persistent_volume_claim {
            out.push((ns.clone(), c.claim_name.clone()));
        } else if v.ephemeral.is_some() {
            out.push((ns.clone(), format!("{name}-{}", v.name)));
        }
    }
    out
}

/// Whether a claim's volume lives in one zone, from its provisioner annotation;
/// None when the claim says nothing (bound statically, or not read). Pure.
pub fn claim_is_zonal(pvc: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> Option<bool> {
    let a = pvc.metadata.annotations.as_ref()?;
    let p = a
        .get("volume.kubernetes.io/storage-provisioner")
        .or_else(|| a.get("volume.beta.kubernetes.io/storage-provisioner"))?;
    Some(ZONAL_PROVISIONERS.contains(&p.as_str()))
}

/// Which pods pin themselves to zones. `claims` holds the claims that were read, by
/// (namespace, name); a claim missing there, or one that names no provisioner,
/// counts as zonal (a warning is cheaper than a pod pending forever). Finished pods
/// do not count. Pure.
pub fn zonal_use(
    pods: &[k8s_openapi::api::core::v1::Pod],
    claims: &std::collections::BTreeMap<
        (String, String),
        k8s_openapi::api::core::v1::PersistentVolumeClaim,
    >,
) -> ZonalUse {
    let mut out = ZonalUse::default();
    for pod in pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let id = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let spreads = pod
            .spec
            .iter()
            .flat_map(|s| s.topology_spread_constraints.iter().flatten())
            .any(|c| {
                c.when_unsatisfiable == "DoNotSchedule"
                    && ZONE_KEYS.contains(&c.topology_key.as_str())
            });
        if spreads {
            out.spread.push(id.clone());
        }
        let zonal_volume = pod_claims(pod)
            .iter()
            .any(|k| claims.get(k).and_then(claim_is_zonal).unwrap_or(true));
        if zonal_volume {
            out.volumes.push(id);
        }
    }
    out
}

/// One warning per group that spans several zones while pods pin themselves to
/// zones: CA picks a group, the ASG picks the zone, so the node CA adds for such a
/// pod can land where the pod cannot go. Pure.
pub fn zonal_warnings(groups: &[(String, Vec<String>)], usage: &ZonalUse) -> Vec<String> {
    if usage.spread.is_empty() && usage.volumes.is_empty() {
        return Vec::new();
    }
    let examples = |v: &[String]| {
        let shown: Vec<&str> = v.iter().take(3).map(String::as_str).collect();
        let more = v.len().saturating_sub(shown.len());
        if more > 0 {
            format!("{} and {more} more", shown.join(", "))
        } else {
            shown.join(", ")
        }
    };
    let mut what = Vec::new();
    if !usage.spread.is_empty() {
        what.push(format!(
            "{} pod(s) spread over zones with whenUnsatisfiable: DoNotSchedule ({})",
            usage.spread.len(),
            examples(&usage.spread)
        ));
    }
    if !usage.volumes.is_empty() {
        what.push(format!(
            "{} pod(s) use zonal (EBS) or unread volume claims ({})",
            usage.volumes.len(),
            examples(&usage.volumes)
        ));
    }
    let mut out = Vec::new();
    for (name, zones) in groups {
        let mut zs: Vec<&str> = zones.iter().map(String::as_str).collect();
        zs.sort_unstable();
        zs.dedup();
        if zs.len() < 2 {
            continue;
        }
        out.push(format!(
            "group {name} spans {} zones ({}) and {}: CA scales the group, the ASG picks the zone, so a node added for such a pod can land in a zone it cannot use and the pod stays pending while CA counts it as helped; the fix is one ASG per zone (with --balance-similar-node-groups and the --balancing-ignore-label set of docs/configuration.md)",
            zs.len(),
            zs.join(", "),
            what.join(" and ")
        ));
    }
    out
}

/// Every object of `api`, listed within 20 s. None when the list fails or does not
/// come, after a line saying `section` was NOT checked (naming the `kind`).
async fn list_within<K>(api: &kube::Api<K>, section: &str, kind: &str) -> Option<Vec<K>>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match tokio::time::timeout(
        std::time::Duration::from_secs(20),
        api.list(&kube::api::ListParams::default()),
    )
    .await
    {
        Ok(Ok(l)) => Some(l.items),
        Ok(Err(e)) => {
            println!("\n{section}: NOT checked, listing {kind}s failed: {e}");
            None
        }
        Err(_) => {
            println!("\n{section}: NOT checked, no {kind} list within 20 s");
            None
        }
    }
}

/// Nodes registered by instances in a warm pool that this service never drained:
/// each (group, instance, its `Warmed:*` state, Node) says a bootstrap joined the
/// cluster while the instance warmed (the Node goes NotReady when the instance
/// stops there, and counts in CA's unready nodes). `nodes`: (name, providerID,
/// carries a drain record of this service). Pure.
pub fn registered_while_warming(
    pools: &[(String, Vec<crate::cloud::AsgInstance>)],
    nodes: &[(String, String, bool)],
) -> Vec<String> {
    let mut out = Vec::new();
    for (name, provider_id, drained) in nodes {
        if *drained {
            continue;
        }
        let Some(iid) = crate::provider::provider_id::instance_id(provider_id) else {
            continue;
        };
        for (group, pool) in pools {
            if let Some(i) = pool.iter().find(|i| i.id == iid) {
                out.push(format!(
                    "group {group}: instance {iid} is in the warm pool ({}) and registered Node {name} while warming: keep its bootstrap from joining the cluster in the pool (docs/node-groups.md)",
                    i.state.as_str()
                ));
            }
        }
    }
    out
}

/// Reads each pool (DescribeWarmPool) of the groups that have one and the Nodes,
/// and prints the Nodes registered while warming as warnings; returns them. None:
/// a read failed (nothing is said to be fine that was not read).
pub async fn pool_report(
    client: kube::Client,
    cloud: &dyn crate::cloud::Cloud,
    provider: &Provider,
) -> Option<Vec<String>> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::Api;
    let reg = provider.registry();
    let mut pools = Vec::new();
    for g in reg.groups.iter().filter(|g| g.asg.warm_pool.is_some()) {
        match cloud.warm_pool_instances(&g.asg.name).await {
            Ok(instances) => pools.push((g.asg.name.clone(), instances)),
            Err(e) => {
                println!(
                    "
warm pools: NOT checked, reading the warm pool of {} failed: {}",
                    g.asg.name,
                    aws_sentence(&e)
                );
                return None;
            }
        }
    }
    if pools.iter().all(|(_, p)| p.is_empty()) {
        return Some(Vec::new());
    }
    let client = named(client, CHECK_CONFIG);
    let nodes: Api<Node> = Api::all(client);
    let list = list_within(&nodes, "warm pools", "Node").await?;
    let nodes: Vec<(String, String, bool)> =
        list.iter()
            .filter_map(|n| {
                let drained =
                    n.metadata.annotations.as_ref().is_some_and(|a| {
                        a.contains_key(crate::scalein::decide::record::ANNOTATION)
                    });
                Some((
                    n.metadata.name.clone()?,
                    n.spec.as_ref()?.provider_id.clone()?,
                    drained,
                ))
            })
            .collect();
    let warnings = registered_while_warming(&pools, &nodes);
    let instances: usize = pools.iter().map(|(_, p)| p.len()).sum();
    if warnings.is_empty() {
        println!(
            "
warm pools: no Node registered by an instance in a pool ({instances} instance(s) read)"
        );
    } else {
        println!(
            "
warnings ({}):",
            warnings.len()
        );
        for w in &warnings {
            println!("  - {w}");
        }
    }
    Some(warnings)
}

/// Reads the pods (and the claims they use, at most 500) and prints the zonal
/// warnings for the groups the provider found; returns them. Warnings do not fail
/// the check; a read that fails does (None: nothing is said to be fine that was not
/// read).
pub async fn zonal_report(client: kube::Client, provider: &Provider) -> Option<Vec<String>> {
    let client = named(client, CHECK_CONFIG);
    use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
    use kube::api::Api;
    const MAX_CLAIMS: usize = 500;
    let pods: Api<Pod> = Api::all(client.clone());
    let list = list_within(&pods, "zonal groups", "pod").await?;
    let mut wanted: Vec<(String, String)> = list.iter().flat_map(pod_claims).collect();
    wanted.sort();
    wanted.dedup();
    let mut claims = std::collections::BTreeMap::new();
    for (ns, name) in wanted.into_iter().take(MAX_CLAIMS) {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        if let Ok(Ok(Some(c))) =
            tokio::time::timeout(std::time::Duration::from_secs(5), api.get_opt(&name)).await
        {
            claims.insert((ns, name), c);
        }
    }
    let usage = zonal_use(&list, &claims);
    let reg = provider.registry();
    let groups: Vec<(String, Vec<String>)> = reg
        .groups
        .iter()
        .map(|g| (g.asg.name.clone(), g.asg.availability_zones.clone()))
        .collect();
    let warnings = zonal_warnings(&groups, &usage);
    if warnings.is_empty() {
        println!(
            "\nzonal groups: no group spans several zones while pods pin themselves to zones ({} pod(s) read)",
            list.len()
        );
    } else {
        println!("\nwarnings ({}):", warnings.len());
        for w in &warnings {
            println!("  - {w}");
        }
    }
    Some(warnings)
}
