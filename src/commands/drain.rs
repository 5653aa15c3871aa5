//! `ca-asg-provider drain NODE`: the scale-in engine on one node from the command
//! line, like `kubectl drain` but DaemonSet-last; `--dry-run` prints the plan.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::Api;

use clap::Args;

use crate::config::ConfigArgs;
use crate::provider::{provider_id, Provider};
use crate::scalein::decide::plan;
use crate::scalein::decide::record::Limits;
use crate::scalein::progress::{self, Narrator, Phase};
use crate::scalein::stages::terminate;
use crate::scalein::{self, DaemonSetPolicy, DrainRequest, Engine, Mode, Outcome, Source};

#[derive(Debug, Args, Clone)]
pub struct DrainArgs {
    /// The Node to drain.
    pub node: String,
    /// Print the plan (which pods, in which phase) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// After the drain, end the instance as DeleteNodes would (lifecycle hook or
    /// terminate with decrement). Without it the node is left cordoned and running.
    #[arg(long)]
    pub terminate: bool,
    #[command(flatten)]
    pub config: ConfigArgs,
}

pub async fn run(args: DrainArgs) -> anyhow::Result<()> {
    let cfg = args.config.load()?;
    let client = crate::scalein::kube_client().await?;
    drain(client, &cfg, &args).await
}

/// How often the drain is read back to say where it stands.
pub const PROGRESS_POLL: Duration = Duration::from_secs(2);
/// How often, while pods keep the drain waiting, the pods and budgets are named.
pub const BLOCKERS_EVERY: Duration = Duration::from_secs(10);

/// Where the command's lines go (standard output; a test's list).
pub type Say = Arc<dyn Fn(&str) + Send + Sync>;

/// Drains `args.node` through `client`, printing to standard output.
pub async fn drain(
    client: kube::Client,
    cfg: &crate::config::Config,
    args: &DrainArgs,
) -> anyhow::Result<()> {
    drain_saying(client, cfg, args, Arc::new(|l: &str| println!("{l}"))).await
}

/// [`drain`], each line of its output given to `say`.
pub async fn drain_saying(
    client: kube::Client,
    cfg: &crate::config::Config,
    args: &DrainArgs,
    say: Say,
) -> anyhow::Result<()> {
    let client =
        crate::scalein::kube::user_agent::named(client, crate::scalein::kube::user_agent::DRAIN);
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .get_opt(&args.node)
        .await?
        .ok_or_else(|| anyhow::anyhow!("node {:?} not found", args.node))?;
    let iid = node
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(provider_id::instance_id)
        .map(str::to_string);
    let pods = crate::scalein::kube::nodes::pods_on(&client, &args.node).await?;
    let keep = cfg.scale_in.daemonsets == DaemonSetPolicy::Keep;
    say(&format!(
        "plan for node {} (instance {}):",
        args.node,
        iid.as_deref().unwrap_or("unknown")
    ));
    for (p, r) in plan::full_plan(&pods, !keep) {
        match r {
            Ok(t) => say(&format!("  {:<20} {p}", t.as_str())),
            Err(why) => say(&format!("  {:<20} {p}  ({why})", "skip")),
        }
    }
    if args.dry_run {
        say("dry run: nothing changed");
        return Ok(());
    }
    let mut cfg = cfg.clone();
    let region = crate::cloud::aws::resolve_known_region(&cfg.aws_settings())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    cfg.set_region(region);
    let cfg = &cfg;
    let cloud = crate::cloud::aws::connect(&cfg.aws_settings()).await;
    let (mode, group, provider) = if args.terminate {
        let iid = iid.clone().ok_or_else(|| {
            anyhow::anyhow!(
                "node {} has no AWS providerID; cannot --terminate",
                args.node
            )
        })?;
        let provider = Provider::new(cloud.clone(), cfg.provider.clone());
        provider.refresh_now().await?;
        let reg = provider.registry();
        let g = reg
            .group_of_instance(&iid)
            .ok_or_else(|| anyhow::anyhow!("instance {iid} is in no managed node group"))?;
        (Mode::Direct, g.asg.name.clone(), Some(provider.clone()))
    } else {
        (Mode::DrainOnly, String::new(), None::<Arc<Provider>>)
    };
    let engine = Engine::new(
        client.clone(),
        cloud,
        provider.clone(),
        cfg.scale_in.clone(),
    );
    let (mode, group) = match (&provider, mode) {
        (Some(p), Mode::Direct) => {
            let reg = p.registry();
            let g = reg.group(&group).expect("group found above");
            let m = engine.mode_for(g, iid.as_deref().unwrap_or_default());
            if m == Mode::Direct {
                p.register_deferred(iid.as_deref().unwrap_or_default(), &group);
            } else if let Mode::Lifecycle { .. } = &m {
                terminate::hand_to_hook(&engine, iid.as_deref().unwrap_or_default()).await?;
            }
            (m, group)
        }
        (_, m) => (m, group),
    };
    let id = iid.clone().unwrap_or_else(|| args.node.clone());
    say(&match &mode {
        Mode::DrainOnly => format!(
            "draining {}: workloads first, DaemonSet pods last; the instance keeps running and the node stays cordoned",
            args.node
        ),
        Mode::Direct => format!(
            "draining {}: workloads first, DaemonSet pods last; then instance {id} is terminated and group {group}'s desired capacity lowered by one",
            args.node
        ),
        Mode::Lifecycle { .. } => format!(
            "draining {}: workloads first, DaemonSet pods last; then the lifecycle hook's action for instance {id} in group {group} is completed and AWS ends it",
            args.node
        ),
    });
    let reasons = vec![scalein::ca_reason(&mode)];
    let lifecycle = matches!(mode, Mode::Lifecycle { .. });
    let limits = engine.limits();
    engine.start(DrainRequest {
        instance_id: id.clone(),
        group,
        node_name: Some(args.node.clone()),
        mode,
        source: Source::Cli,
        reasons,
        noticed: None,
    });
    let watch = tokio::spawn(narrate(
        client.clone(),
        args.node.clone(),
        limits,
        say.clone(),
    ));
    let outcome = engine.wait_for(&id).await;
    watch.abort();
    tokio::time::sleep(Duration::from_millis(50)).await;
    match outcome {
        Some(Outcome::Ended) if lifecycle => say("done: node drained; the lifecycle hook's action was completed and AWS ends the instance"),
        Some(Outcome::Ended) => say("done: node drained and its instance terminated"),
        Some(Outcome::Drained) => say(&format!(
            "done: node drained; it stays cordoned (`ca-asg-provider undrain {}` gives it back)",
            args.node
        )),
        Some(Outcome::Abandoned(why)) => anyhow::bail!("drain abandoned: {why}"),
        Some(Outcome::Failed(why)) => anyhow::bail!("drain failed: {why}"),
        Some(Outcome::Observed(what)) => say(&what),
        None => anyhow::bail!("the drain stopped before it ended (its task went away)"),
    }
    Ok(())
}

/// Reads the drain of `node` back every [`PROGRESS_POLL`] and says where it stands
/// ([`Narrator`]): a line per phase, and while pods keep it, which and why. A read
/// that fails says nothing (the next one tries again): the drain itself is not
/// affected.
async fn narrate(client: kube::Client, node: String, limits: Limits, say: Say) {
    let nodes: Api<Node> = Api::all(client.clone());
    let attachments: Api<VolumeAttachment> = Api::all(client.clone());
    let mut narrator = Narrator::new(&node, BLOCKERS_EVERY);
    let mut tick = tokio::time::interval(PROGRESS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Ok(Some(n)) = nodes.get_opt(&node).await else {
            continue;
        };
        let Ok(pods) = crate::scalein::kube::nodes::pods_on(&client, &node).await else {
            continue;
        };
        let now = crate::clock::utc_now();
        let mut row = progress::row(&n, &pods, &[], limits, now);
        // The budgets of the namespaces whose pods keep it, only while any do.
        if let Some(r) = row.as_ref().filter(|r| !r.blocked_by.is_empty()) {
            let mut namespaces: Vec<&str> = r
                .blocked_by
                .iter()
                .filter_map(|b| b.pod.split_once('/').map(|(ns, _)| ns))
                .collect();
            namespaces.sort_unstable();
            namespaces.dedup();
            let mut pdbs = Vec::new();
            for ns in namespaces {
                let api: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
                if let Ok(list) = api.list(&ListParams::default()).await {
                    pdbs.extend(list.items);
                }
            }
            row = progress::row(&n, &pods, &pdbs, limits, now);
        }
        let volumes = match row.as_ref().map(|r| r.phase) {
            Some(Phase::Drained) => match attachments.list(&ListParams::default()).await {
                Ok(list) => list
                    .items
                    .iter()
                    .filter(|va| va.spec.node_name == node)
                    .count(),
                Err(_) => continue,
            },
            _ => 0,
        };
        for line in narrator.observe(row.as_ref(), volumes, crate::clock::Instant::now()) {
            say(&line);
        }
    }
}
