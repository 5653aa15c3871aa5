//! `ca-asg-provider drain NODE`: the scale-in engine on one node from the command
//! line, like `kubectl drain` but DaemonSet-last; `--dry-run` prints the plan.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use clap::Args;

use crate::config::ConfigArgs;
use crate::provider::{provider_id, Provider};
use crate::scalein::decide::plan;
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

/// Shared with tests: drains `args.node` through `client`.
pub async fn drain(
    client: kube::Client,
    cfg: &crate::config::Config,
    args: &DrainArgs,
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
    println!(
        "plan for node {} (instance {}):",
        args.node,
        iid.as_deref().unwrap_or("unknown")
    );
    for (p, r) in plan::full_plan(&pods, !keep) {
        match r {
            Ok(t) => println!("  {:<20} {p}", t.as_str()),
            Err(why) => println!("  {:<20} {p}  ({why})", "skip"),
        }
    }
    if args.dry_run {
        println!("dry run: nothing changed");
        return Ok(());
    }
    let mut cfg = cfg.clone();
    let region = crate::cloud::aws::resolve_region(&cfg.aws_settings())
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
    let engine = Engine::new(client, cloud, provider.clone(), cfg.scale_in.clone());
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
    println!("draining {} ({} mode)...", args.node, mode.as_str());
    let reasons = vec![scalein::ca_reason(&mode)];
    engine.start(DrainRequest {
        instance_id: id.clone(),
        group,
        node_name: Some(args.node.clone()),
        mode,
        source: Source::Cli,
        reasons,
        noticed: None,
    });
    let outcome = engine.wait_for(&id).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    match outcome {
        Some(Outcome::Ended) => println!("done: node drained and instance ended"),
        Some(Outcome::Drained) => println!("done: node drained; it stays cordoned"),
        Some(Outcome::Abandoned(why)) => anyhow::bail!("drain abandoned: {why}"),
        Some(Outcome::Failed(why)) => anyhow::bail!("drain failed: {why}"),
        Some(Outcome::Observed(what)) => println!("{what}"),
        None => anyhow::bail!("drain task ended unexpectedly"),
    }
    Ok(())
}
