//! `ca-asg-provider drain NODE`: the scale-in engine on one node from the command
//! line, like `kubectl drain` but DaemonSet-last; `--dry-run` prints the plan.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event as EventV1;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::ListParams;
use kube::Api;

use clap::Args;

use crate::config::ConfigArgs;
use crate::provider::{provider_id, Provider};
use crate::scalein::decide::plan;
use crate::scalein::decide::record::{DrainRecord, How, Limits};
use crate::scalein::engine::leader::{self, Claim, LeaseSettings};
use crate::scalein::progress::{self, Followed, Narrator, Phase, Warnings};
use crate::scalein::stages::drain::AbortOnDrop;
use crate::scalein::stages::{cordon, terminate};
use crate::scalein::{self, DaemonSetPolicy, DrainRequest, Engine, Mode, Outcome, Source};
use k8s_openapi::api::coordination::v1::Lease;

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
    let say: Say = Arc::new(|l: &str| println!("{l}"));
    drain_until(client, None, &cfg, &args, say, super::shutdown_signal()).await
}

/// How often the drain is read back to say where it stands.
pub const PROGRESS_POLL: Duration = Duration::from_secs(2);
/// How long a followed drain's command, once the record says the drain ended, looks
/// for the leader's last warning ([`Watch::relay_last_word`]), and how often.
pub const LAST_WORD_WAIT: Duration = Duration::from_secs(5);
const LAST_WORD_LOOK: Duration = Duration::from_millis(250);
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
    drain_in(client, None, cfg, args, say).await
}

/// [`drain_saying`] through `cloud` (a test's memory cloud), or AWS as the
/// configuration says when `None`.
pub async fn drain_in(
    client: kube::Client,
    cloud: Option<Arc<dyn crate::cloud::Cloud>>,
    cfg: &crate::config::Config,
    args: &DrainArgs,
    say: Say,
) -> anyhow::Result<()> {
    drain_until(client, cloud, cfg, args, say, std::future::pending()).await
}

/// [`drain_in`] until `stop` resolves (the command: SIGINT or SIGTERM). Stopped
/// before the drain ends, it stops draining, gives its Lease back at once (not left
/// to expire), says how the node is left (cordoned, marked, the pods evicted so
/// far) and the `undrain` line that gives it back, and fails. Following the
/// service's leader, it stops following: the leader's drain goes on.
pub async fn drain_until(
    client: kube::Client,
    cloud: Option<Arc<dyn crate::cloud::Cloud>>,
    cfg: &crate::config::Config,
    args: &DrainArgs,
    say: Say,
    stop: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    use crate::scalein::kube::user_agent;
    let lease_client = user_agent::named(client.clone(), user_agent::LEASE);
    let client = user_agent::named(client, user_agent::DRAIN);
    let (iid, planned) = say_plan(&client, cfg, &args.node, &say).await?;
    if args.dry_run {
        say("dry run: nothing changed");
        return Ok(());
    }
    let (cloud, cfg) = connect(cloud, cfg).await?;
    let cfg = &cfg;
    let provider = match args.terminate {
        true => Some(provider_for(&cloud, cfg, &args.node, iid.as_deref()).await?),
        false => None,
    };
    let engine = Engine::new(
        client.clone(),
        cloud,
        provider.as_ref().map(|(p, _)| p.clone()),
        cfg.scale_in.clone(),
    );
    let target = Target::resolve(&engine, &args.node, iid, provider.as_ref());
    say(&target.intent());
    // What the node already shows is primed before anything changes: only the
    // warnings of this drain are relayed.
    let narrator = Narrator::new(&target.node, BLOCKERS_EVERY)
        .daemonset_deadline(
            cfg.scale_in.daemonset_deadline,
            match target.mode {
                // The ASG ends the instance whatever the hook's result: the drain goes on.
                Mode::Lifecycle { .. } => scalein::DeadlinePolicy::Proceed,
                _ => cfg.scale_in.daemonset_deadline_policy,
            },
        )
        .daemonsets_stay(target.daemonsets_stay);
    let watch = Watch::start(client.clone(), narrator, engine.limits()).await;
    let role = std::sync::OnceLock::new();
    let drive = async {
        // Before anything changes: who drains. One engine per node, never two.
        match who_drains(&lease_client, cfg, &say).await? {
            Who::Leader(holder, lease) => {
                let _ = role.set(Who::Leader(holder.clone(), lease.clone()));
                let lease = (
                    Api::namespaced(lease_client.clone(), &lease.namespace),
                    lease,
                );
                let result =
                    hand_to_leader(&engine, &client, &target, &holder, &lease, watch, &say).await;
                engine.shutdown();
                result
            }
            Who::Here(lease) => {
                let _ = role.set(Who::Here(lease.clone()));
                let provider = provider.as_ref().map(|(p, _)| p);
                drain_here(&engine, provider, &target, lease, watch, &say).await
            }
        }
    };
    let outcome = tokio::select! {
        outcome = drive => outcome?,
        () = stop => {
            let left = Left { target: &target, planned: &planned };
            return Err(left.interrupted(&engine, &client, &lease_client, role.get(), &say).await);
        }
    };
    say(&outcome);
    Ok(())
}

/// What `drain NODE` says when it is stopped before its drain ends.
struct Left<'a> {
    target: &'a Target,
    /// The pods the plan evicts (`namespace/name`).
    planned: &'a [String],
}

impl Left<'_> {
    /// Stops draining, gives the Lease back when the command held it, says how the
    /// node is left and the `undrain` line, and returns the command's error.
    async fn interrupted(
        &self,
        engine: &Arc<Engine>,
        client: &kube::Client,
        lease_client: &kube::Client,
        role: Option<&Who>,
        say: &Say,
    ) -> anyhow::Error {
        let node = &self.target.node;
        if let Some(Who::Leader(holder, _)) = role {
            engine.shutdown();
            say(&format!(
                "interrupted: stopped following; the service's leader {holder} goes on draining {node} (`ca-asg-provider status` shows it)"
            ));
            return anyhow::anyhow!("interrupted while following the drain of node {node}");
        }
        // The drains stop first, then the Lease is released (Engine::step_down).
        engine.step_down().await;
        say(&format!(
            "interrupted: the drain of {node} stopped; {}",
            self.node_said(client).await
        ));
        if let Some(Who::Here(Some(lease))) = role {
            say(&released_said(lease_client, lease).await);
        }
        say(&format!(
            "to give the node back: ca-asg-provider undrain {node}"
        ));
        anyhow::anyhow!("interrupted before the drain of node {node} finished")
    }

    /// `node n1 is left cordoned, tainted and marked with its drain record; evicted so
    /// far: shop/app; still on it: logging/fluentd-x`, as read now.
    async fn node_said(&self, client: &kube::Client) -> String {
        let name = self.target.node.as_str();
        let nodes: Api<Node> = Api::all(client.clone());
        let n = match nodes.get_opt(name).await {
            Ok(Some(n)) => n,
            Ok(None) => return format!("node {name} is gone"),
            Err(e) => return format!("node {name} cannot be read now ({e})"),
        };
        let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == cordon::TAINT_KEY));
        let marked = n
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(crate::scalein::decide::record::ANNOTATION));
        let mut marks = Vec::new();
        if cordoned {
            marks.push("cordoned");
        }
        if tainted {
            marks.push("tainted");
        }
        if marked {
            marks.push("marked with its drain record");
        }
        let state = match marks.len() {
            0 => format!("node {name} carries none of the drain's marks"),
            _ => format!("node {name} is left {}", marks.join(", ")),
        };
        let pods = match crate::scalein::kube::nodes::pods_on(client, name).await {
            Ok(p) => p,
            Err(e) => return format!("{state}; its pods cannot be read now ({e})"),
        };
        let staying: Vec<String> = pods
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(|p| plan::pod_ref(p).to_string())
            .collect();
        let evicted: Vec<&str> = self
            .planned
            .iter()
            .filter(|p| !staying.contains(p))
            .map(String::as_str)
            .collect();
        let list = |v: &[&str]| match v.len() {
            0 => "none".to_string(),
            _ => v.join(", "),
        };
        let still: Vec<&str> = self
            .planned
            .iter()
            .filter(|p| staying.contains(p))
            .map(String::as_str)
            .collect();
        format!(
            "{state}; evicted so far: {}; still on it: {}",
            list(&evicted),
            list(&still)
        )
    }
}

/// Whether the Lease this command held is given back, as read back now.
async fn released_said(client: &kube::Client, lease: &LeaseSettings) -> String {
    let api: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    let holder = api.get_opt(&lease.name).await.map(|l| {
        l.and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .unwrap_or_default()
    });
    match holder {
        Ok(h) if h != lease.identity => format!(
            "released the Lease {}/{}: a replica of the service may lead now (and would resume the drain recorded on the node)",
            lease.namespace, lease.name
        ),
        Ok(_) => format!(
            "could not release the Lease {}/{}: it expires within {:?}",
            lease.namespace, lease.name, lease.duration
        ),
        Err(e) => format!(
            "cannot read the Lease {}/{} back ({e}); if still held, it expires within {:?}",
            lease.namespace, lease.name, lease.duration
        ),
    }
}

/// Reads the node and its pods and says the plan: which pod goes in which phase, and
/// which stay. Returns the node's instance (from its AWS providerID) and the pods
/// the plan evicts.
async fn say_plan(
    client: &kube::Client,
    cfg: &crate::config::Config,
    node: &str,
    say: &Say,
) -> anyhow::Result<(Option<String>, Vec<String>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let n = nodes
        .get_opt(node)
        .await?
        .ok_or_else(|| anyhow::anyhow!("node {node:?} not found"))?;
    let iid = n
        .spec
        .as_ref()
        .and_then(|s| s.provider_id.as_deref())
        .and_then(provider_id::instance_id)
        .map(str::to_string);
    let pods = crate::scalein::kube::nodes::pods_on(client, node).await?;
    let keep = cfg.scale_in.daemonsets == DaemonSetPolicy::Keep;
    say(&format!(
        "plan for node {node} (instance {}):",
        iid.as_deref().unwrap_or("unknown")
    ));
    let mut planned = Vec::new();
    for (p, r) in plan::full_plan(&pods, !keep, crate::clock::timestamp_now()) {
        match r {
            Ok(t) => {
                say(&format!("  {:<20} {p}", t.as_str()));
                planned.push(p.to_string());
            }
            Err(why) => say(&format!("  {:<20} {p}  ({why})", "skip")),
        }
    }
    Ok((iid, planned))
}

/// The cloud given (a test's), or AWS in the region the configuration resolves to
/// (the configuration then names it).
async fn connect(
    cloud: Option<Arc<dyn crate::cloud::Cloud>>,
    cfg: &crate::config::Config,
) -> anyhow::Result<(Arc<dyn crate::cloud::Cloud>, crate::config::Config)> {
    let mut cfg = cfg.clone();
    let cloud = match cloud {
        Some(cloud) => cloud,
        None => {
            let region = crate::cloud::aws::resolve_known_region(&cfg.aws_settings())
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            cfg.set_region(region);
            crate::cloud::aws::connect(&cfg.aws_settings()).await
        }
    };
    Ok((cloud, cfg))
}

/// `--terminate`: the provider, refreshed, and the managed group the instance is in.
async fn provider_for(
    cloud: &Arc<dyn crate::cloud::Cloud>,
    cfg: &crate::config::Config,
    node: &str,
    iid: Option<&str>,
) -> anyhow::Result<(Arc<Provider>, String)> {
    let iid = iid
        .ok_or_else(|| anyhow::anyhow!("node {node} has no AWS providerID; cannot --terminate"))?;
    let provider = Provider::new(cloud.clone(), cfg.provider.clone());
    provider.refresh_now().await?;
    let group = provider
        .registry()
        .group_of_instance(iid)
        .ok_or_else(|| anyhow::anyhow!("instance {iid} is in no managed node group"))?
        .asg
        .name
        .clone();
    Ok((provider, group))
}

/// The node, its instance and how it ends, as the command resolved them.
struct Target {
    node: String,
    /// The instance, or the node's name when it has no AWS providerID.
    id: String,
    group: String,
    mode: Mode,
    /// The group's warm pool takes instances back on scale-in: our hook's completed
    /// action may return the instance to the pool instead of ending it.
    to_pool: bool,
    /// `scaleIn.daemonSets: keep`: the DaemonSet pods stay on the node.
    daemonsets_stay: bool,
}

impl Target {
    /// The node's drain as the command runs it: with `--terminate` (a provider and
    /// the instance's group) ended as DeleteNodes would end it, else drain only.
    fn resolve(
        engine: &Engine,
        node: &str,
        iid: Option<String>,
        provider: Option<&(Arc<Provider>, String)>,
    ) -> Self {
        let (group, mode, to_pool) = match provider {
            Some((p, group)) => {
                let reg = p.registry();
                let g = reg.group(group).expect("group found by provider_for");
                let mode = engine.mode_for(g, iid.as_deref().unwrap_or_default());
                let to_pool = g
                    .asg
                    .warm_pool
                    .as_ref()
                    .is_some_and(|w| w.reuse_on_scale_in);
                (group.clone(), mode, to_pool)
            }
            None => (String::new(), Mode::DrainOnly, false),
        };
        Target {
            node: node.to_string(),
            id: iid.unwrap_or_else(|| node.to_string()),
            group,
            mode,
            to_pool,
            daemonsets_stay: engine.settings.daemonsets == DaemonSetPolicy::Keep,
        }
    }

    /// What the command is about to do, in a line.
    fn intent(&self) -> String {
        let Target {
            node,
            id,
            group,
            mode,
            to_pool,
            daemonsets_stay,
        } = self;
        let order = match daemonsets_stay {
            true => "workload pods only, DaemonSet pods stay (scaleIn.daemonSets: keep)",
            false => "workloads first, DaemonSet pods last",
        };
        let aws_ends = match to_pool {
            true => "AWS ends it or, as the group's warm pool reuses instances on scale-in, returns it to the pool (the node is then given back when the instance leaves the pool)",
            false => "AWS ends it",
        };
        match mode {
            Mode::DrainOnly => format!(
                "draining {node}: {order}; the instance keeps running and the node stays cordoned"
            ),
            Mode::Direct => format!(
                "draining {node}: {order}; then instance {id} is terminated and group {group}'s desired capacity lowered by one"
            ),
            Mode::Lifecycle { .. } => format!(
                "draining {node}: {order}; then the lifecycle hook's action for instance {id} in group {group} is completed and {aws_ends}"
            ),
        }
    }

    /// The last line of a drain the leader ran, from how its record says it ended:
    /// an error for one that did not finish.
    fn ended(&self, how: &How) -> anyhow::Result<String> {
        let said = |why: &str| progress::printable(why, crate::scalein::decide::record::MAX_WHY);
        match (how, &self.mode) {
            (How::Drained, Mode::DrainOnly) => Ok(self.done(false)),
            (How::Drained, _) => Ok(format!(
                "done: node {} drained; the service's leader left the instance to run or to AWS (no reason on the node ended it)",
                self.node
            )),
            (How::Ending, Mode::DrainOnly) => Ok(format!(
                "done: node {} drained, and another reason on it had the service hand its instance to its end",
                self.node
            )),
            (How::Ending, _) => Ok(self.done(true)),
            (How::InstanceLeft, _) => anyhow::bail!(
                "the drain did not finish: AWS stopped or ended instance {} first",
                self.id
            ),
            (How::Abandoned { why }, _) => anyhow::bail!(
                "the service's leader gave the drain up: drain abandoned: {}",
                said(why)
            ),
            (How::Failed { why }, _) => anyhow::bail!(
                "the service's leader could not finish the drain: {}; the drain stays recorded on node {} and a restarted service resumes it",
                said(why),
                self.node
            ),
        }
    }

    /// The last line of a drain that ended well.
    fn done(&self, ended: bool) -> String {
        match (&self.mode, ended) {
            (Mode::Lifecycle { .. }, _) if self.to_pool => "done: node drained; the lifecycle hook's action was completed and AWS ends the instance or returns it to the group's warm pool".into(),
            (Mode::Lifecycle { .. }, _) => "done: node drained; the lifecycle hook's action was completed and AWS ends the instance".into(),
            (Mode::Direct, _) => "done: node drained and its instance terminated".into(),
            (Mode::DrainOnly, false) => format!(
                "done: node drained; it stays cordoned (`ca-asg-provider undrain {}` gives it back)",
                self.node
            ),
            (Mode::DrainOnly, true) => format!("done: node {} is gone", self.node),
        }
    }
}

/// This process's drain commands so far: each holds the Lease as itself.
static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Who runs the drain.
enum Who {
    /// This command, holding the Lease when leader election is on.
    Here(Option<LeaseSettings>),
    /// The service's leader, which renews the Lease (the Lease as the command reads it).
    Leader(String, LeaseSettings),
}

/// Reads the Lease the service's replicas elect their leader with. A replica that
/// renews it drains the node: the command records the drain on the Node for it,
/// as a replica that does not lead does with CA's DeleteNodes. Nobody renewing it,
/// the command takes it for the length of its drain, so a replica that starts
/// meanwhile does not resume the drain beside it. A Lease that cannot be read
/// stops the command before anything changes.
async fn who_drains(
    client: &kube::Client,
    cfg: &crate::config::Config,
    say: &Say,
) -> anyhow::Result<Who> {
    if !cfg.scale_in.leader_election {
        say("leader election is off in this configuration: a service running on it would resume this drain beside the command; stop it first");
        return Ok(Who::Here(None));
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into());
    let lease = leader::lease_for(
        &cfg.scale_in,
        format!(
            "{}{host}-{}-{}",
            leader::COMMAND_HOLDER_PREFIX,
            std::process::id(),
            RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ),
    );
    let api: Api<Lease> = Api::namespaced(client.clone(), &lease.namespace);
    let watching = |holder: &str| {
        let now = if holder.starts_with(leader::COMMAND_HOLDER_PREFIX) {
            format!(" (held by {holder}, another drain command: waiting for it)")
        } else {
            String::new()
        };
        say(&format!(
            "reading the Lease {}/{} for up to {:?}{now}: a replica of the service that renews it runs the drain; if none does, this command takes it",
            lease.namespace, lease.name, lease.duration
        ))
    };
    match leader::claim_for_command(&api, &lease, watching).await {
        Ok(Claim::Ours) => Ok(Who::Here(Some(lease))),
        Ok(Claim::Leader(holder)) => Ok(Who::Leader(holder, lease)),
        Err(e) => anyhow::bail!(
            "cannot tell whether the service is draining: {}; nothing was changed",
            leader::explain(&e, &lease)
        ),
    }
}

/// The drain run by this command's engine, holding the Lease while it runs (when
/// given). Returns the last line to say.
async fn drain_here(
    engine: &Arc<Engine>,
    provider: Option<&Arc<Provider>>,
    target: &Target,
    lease: Option<LeaseSettings>,
    watch: Watch,
    say: &Say,
) -> anyhow::Result<String> {
    if let Some(lease) = lease {
        engine.lead_as(lease.clone());
        let mut leads = engine.leadership.receiver().expect("just elected");
        if !matches!(
            tokio::time::timeout(lease.duration, leads.wait_for(|l| *l)).await,
            Ok(Ok(_))
        ) {
            engine.step_down().await;
            anyhow::bail!(
                "could not keep the Lease {}/{} to drain; nothing was changed",
                lease.namespace,
                lease.name
            );
        }
    }
    let result = run_here(engine, provider, target, watch, say).await;
    // Stops leading and gives the Lease back (no-op without one).
    engine.step_down().await;
    result
}

async fn run_here(
    engine: &Arc<Engine>,
    provider: Option<&Arc<Provider>>,
    target: &Target,
    watch: Watch,
    say: &Say,
) -> anyhow::Result<String> {
    match (&target.mode, provider) {
        (Mode::Direct, Some(p)) => p.register_deferred(&target.id, &target.group),
        (Mode::Lifecycle { .. }, _) => {
            terminate::hand_to_hook(engine.cloud.as_ref(), &target.id).await?
        }
        _ => {}
    }
    engine.start(DrainRequest {
        instance_id: target.id.clone(),
        group: target.group.clone(),
        node_name: Some(target.node.clone()),
        mode: target.mode.clone(),
        source: Source::Cli,
        reasons: vec![scalein::ca_reason(&target.mode)],
        noticed: None,
    });
    // Stopped with the command (interrupted) as well as after the drain.
    let narrating = AbortOnDrop(tokio::spawn(narrate(watch, say.clone())));
    let outcome = engine.wait_for(&target.id).await;
    drop(narrating);
    tokio::time::sleep(Duration::from_millis(50)).await;
    match outcome {
        Some(Outcome::Ended) => Ok(target.done(true)),
        Some(Outcome::Drained) => Ok(target.done(false)),
        Some(Outcome::Abandoned(why)) => anyhow::bail!("drain abandoned: {why}"),
        Some(Outcome::Failed(why)) => anyhow::bail!("drain failed: {why}"),
        Some(Outcome::Observed(what)) => Ok(what),
        None => anyhow::bail!("the drain stopped before it ended (its task went away)"),
    }
}

/// The service's leader runs the drain: it is recorded where the leader finds it
/// (our hook's hold in AWS, or the record on the Node, as a replica that does not
/// lead answers DeleteNodes), and followed from here until it ends.
async fn hand_to_leader(
    engine: &Arc<Engine>,
    client: &kube::Client,
    target: &Target,
    holder: &str,
    lease: &(Api<Lease>, LeaseSettings),
    watch: Watch,
    say: &Say,
) -> anyhow::Result<String> {
    // Which drain to follow: the one this hand-over joins, by its number.
    let drain = match &target.mode {
        Mode::Lifecycle { .. } => {
            // The leader records the drain when its scan finds our hook's hold: the
            // drain it then runs is the one running now, or the next.
            let nodes: Api<Node> = Api::all(client.clone());
            let node = nodes
                .get_opt(&target.node)
                .await?
                .ok_or_else(|| anyhow::anyhow!("node {:?} not found", target.node))?;
            let annotations = node.metadata.annotations.unwrap_or_default();
            let drain = DrainRecord::drain_joined(
                crate::scalein::kube::node_record::record_of(&annotations).as_ref(),
            );
            terminate::hand_to_hook(engine.cloud.as_ref(), &target.id).await?;
            drain
        }
        mode => {
            let reasons = vec![scalein::ca_reason(mode)];
            match cordon::cordon_via(
                &engine.stage(),
                client,
                &target.node,
                &reasons,
                &target.group,
                // The engine that runs the drain (the leader's, or this one's)
                // gives it its deadline to keep.
                None,
            )
            .await?
            {
                cordon::Cordoned::Marked { record, .. } => {
                    (record.drain != 0).then_some(record.drain)
                }
                cordon::Cordoned::NodeGone => anyhow::bail!("node {:?} not found", target.node),
            }
        }
    };
    say(&format!(
        "the service's leader {holder} runs the drain (recorded for it on {}); following it here: Ctrl-C stops following, not the drain",
        target.node
    ));
    match drain {
        Some(drain) => follow(engine, target, drain, lease, watch, say).await,
        None => follow_unnumbered(engine, target, lease, watch, say).await,
    }
}

/// A follower's turns: every [`PROGRESS_POLL`] the Lease is read (said once when no
/// replica renews it any more, as the drain then waits, recorded, for a replica to
/// lead, and again when one does), then the node.
struct Following {
    tick: tokio::time::Interval,
    observed: leader::Observed,
    unled: bool,
}

impl Following {
    fn new() -> Self {
        let mut tick = tokio::time::interval(PROGRESS_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Following {
            tick,
            observed: leader::Observed::default(),
            unled: false,
        }
    }

    /// The next turn whose read of the node went through (one that failed waits for
    /// the next turn).
    async fn next(
        &mut self,
        lease: &(Api<Lease>, LeaseSettings),
        watch: &mut Watch,
        say: &Say,
    ) -> Seen {
        loop {
            self.tick.tick().await;
            self.look(lease, &watch.node, say).await;
            if let Some(seen) = watch.look(say).await {
                return seen;
            }
        }
    }

    async fn look(
        &mut self,
        (lease_api, lease): &(Api<Lease>, LeaseSettings),
        node: &str,
        say: &Say,
    ) {
        let Ok(current) = lease_api.get_opt(&lease.name).await else {
            return;
        };
        let spec = current.as_ref().and_then(|l| l.spec.as_ref());
        let unchanged_for = self.observed.note(spec);
        let nobody = matches!(
            leader::decide(spec, &lease.identity, unchanged_for),
            leader::Decision::Acquire | leader::Decision::Create
        );
        if nobody != self.unled {
            self.unled = nobody;
            say(&if nobody {
                format!(
                    "no replica of the service renews the Lease {}/{} now: the drain waits, recorded on {node}, for one to lead",
                    lease.namespace, lease.name
                )
            } else {
                let holder = spec
                    .and_then(|s| s.holder_identity.as_deref())
                    .unwrap_or_default();
                format!("{holder} leads again: the drain goes on")
            });
        }
    }
}

/// Reads drain number `drain`, which the leader runs, back every [`PROGRESS_POLL`]
/// ([`Following`]),
/// saying where it stands, until it ends: the Node's record says how
/// ([`progress::followed`]), the Node is gone, or (terminated directly, the record's
/// last word not written) AWS shows the instance ending. Events are relayed for
/// people; nothing is decided from them.
async fn follow(
    engine: &Arc<Engine>,
    target: &Target,
    drain: u64,
    lease: &(Api<Lease>, LeaseSettings),
    mut watch: Watch,
    say: &Say,
) -> anyhow::Result<String> {
    let mut following = Following::new();
    let mut seen = false;
    loop {
        let record = match following.next(lease, &mut watch, say).await {
            Seen::Gone => return Ok(target.done(true)),
            Seen::Row(_, record) => record,
        };
        match progress::followed(record.as_ref(), drain, seen) {
            Followed::NotYet => {}
            Followed::Runs => seen = true,
            Followed::Ended(how) => {
                watch.relay_last_word(&how, say).await;
                return target.ended(&how);
            }
            Followed::GivenBack => anyhow::bail!(
                "the drain was given up: its record left node {} (its deadline passed with policy abandon, or `undrain`){}; `kubectl describe node {}` shows the Events",
                target.node,
                watch.abandoned().map(|why| format!(": {why}")).unwrap_or_default(),
                target.node
            ),
            Followed::Stopped => anyhow::bail!(
                "the drain on node {} no longer runs and its record does not say how it ended (a service of an older version, or its reasons closed by hand); `kubectl describe node {}` shows the Events",
                target.node, target.node
            ),
            Followed::Passed(now) => anyhow::bail!(
                "the drain this command handed over (number {drain} on node {}) ended unseen and drain number {now} followed it; `kubectl describe node {}` shows the Events",
                target.node, target.node
            ),
        }
        if seen && target.mode == Mode::Direct && instance_ends(engine, &target.id).await {
            return Ok(target.done(true));
        }
    }
}

/// [`follow`] for a drain an older version recorded (unnumbered): its end is read
/// from the record's shape and the leader's `DrainAbandoned` Event, as that version
/// wrote them.
async fn follow_unnumbered(
    engine: &Arc<Engine>,
    target: &Target,
    lease: &(Api<Lease>, LeaseSettings),
    mut watch: Watch,
    say: &Say,
) -> anyhow::Result<String> {
    let mut following = Following::new();
    let mut recorded = false;
    loop {
        let phase = match following.next(lease, &mut watch, say).await {
            Seen::Gone => return Ok(target.done(true)),
            Seen::Row(phase, _) => phase,
        };
        match phase {
            Some(Phase::Finished) => {
                // The leader says it gave the drain up in an Event, written after the
                // record (and queued behind the drains in a storm): one more look.
                tokio::time::sleep(PROGRESS_POLL).await;
                watch.relay_warnings(say).await;
                if let Some(why) = watch.abandoned() {
                    anyhow::bail!("the service's leader gave the drain up: {why}");
                }
                return Ok(target.done(false));
            }
            Some(_) => recorded = true,
            None if recorded => anyhow::bail!(
                "the drain was given up: its record left node {} (its deadline passed, or `undrain`){}; `kubectl describe node {}` shows the Events",
                target.node,
                watch.abandoned().map(|why| format!(": {why}")).unwrap_or_default(),
                target.node
            ),
            None => {}
        }
        if recorded && target.mode == Mode::Direct && instance_ends(engine, &target.id).await {
            return Ok(target.done(true));
        }
    }
}

/// Whether AWS shows the instance ending, ended or gone from its group. `false` when
/// AWS cannot be asked (the next round asks again).
async fn instance_ends(engine: &Engine, id: &str) -> bool {
    match engine.cloud.locate_instances(&[id.to_string()]).await {
        Ok(found) => found
            .iter()
            .find(|l| l.instance_id == id)
            .is_none_or(|l| l.state.is_terminating()),
        Err(_) => false,
    }
}

/// Reads the drain of `node` back every [`PROGRESS_POLL`] and says where it stands
/// ([`Narrator`]): a line per phase, and while pods keep it, which and why. A read
/// that fails says nothing (the next one tries again): the drain itself is not
/// affected.
async fn narrate(mut watch: Watch, say: Say) {
    let mut tick = tokio::time::interval(PROGRESS_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        watch.look(&say).await;
    }
}

/// What one look at the node found.
enum Seen {
    /// The Node object is gone.
    Gone,
    /// The drain's phase as its record says, and the record; `None` without one.
    Row(Option<Phase>, Option<DrainRecord>),
}

/// The node's drain, read back and narrated.
struct Watch {
    client: kube::Client,
    node: String,
    limits: Limits,
    narrator: Narrator,
    /// The service's warnings on the node, relayed; `None` when the node's Events
    /// could not be read at the start (what was there before cannot be told apart).
    warnings: Option<Warnings>,
}

impl Watch {
    /// Begins watching the node: its Events as they are now are primed, so only
    /// the warnings of this drain are relayed.
    async fn start(client: kube::Client, narrator: Narrator, limits: Limits) -> Self {
        let node = narrator.node().to_string();
        let warnings = node_events(&client, &node)
            .await
            .map(|events| Warnings::primed(&node, &events));
        Watch {
            client,
            node,
            limits,
            narrator,
            warnings,
        }
    }

    /// Reads the node, its pods and (while pods keep the drain) their namespaces'
    /// budgets, and says what changed. `None` when a read failed.
    async fn look(&mut self, say: &Say) -> Option<Seen> {
        let (client, node) = (&self.client, self.node.as_str());
        let nodes: Api<Node> = Api::all(client.clone());
        let n = match nodes.get_opt(node).await.ok()? {
            Some(n) => n,
            None => return Some(Seen::Gone),
        };
        let pods = crate::scalein::kube::nodes::pods_on(client, node)
            .await
            .ok()?;
        let now = crate::clock::utc_now();
        let record = n
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| DrainRecord::read(a, now));
        let mut row = progress::row(&n, &pods, &[], self.limits, now);
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
            row = progress::row(&n, &pods, &pdbs, self.limits, now);
        }
        let volumes = match row.as_ref().map(|r| r.phase) {
            Some(Phase::Drained) => {
                let attachments: Api<VolumeAttachment> = Api::all(client.clone());
                let list = attachments.list(&ListParams::default()).await.ok()?;
                list.items
                    .iter()
                    .filter(|va| va.spec.node_name == node)
                    .count()
            }
            _ => 0,
        };
        for line in self
            .narrator
            .observe(row.as_ref(), volumes, crate::clock::Instant::now())
        {
            say(&line);
        }
        self.relay_warnings(say).await;
        Some(Seen::Row(row.map(|r| r.phase), record))
    }

    /// Why the drain was given up, when the service said so in a warning relayed.
    fn abandoned(&self) -> Option<String> {
        self.warnings.as_ref()?.abandoned().map(str::to_string)
    }

    /// Relays the leader's last warnings on a drain that ended `how`: they may land
    /// after the record ([`Warnings::heard_last_word`]), so the Events are read again
    /// until the last word is relayed, at most [`LAST_WORD_WAIT`] (then the command
    /// ends on the record alone).
    async fn relay_last_word(&mut self, how: &How, say: &Say) {
        let until = tokio::time::Instant::now() + LAST_WORD_WAIT;
        loop {
            self.relay_warnings(say).await;
            let heard = self
                .warnings
                .as_ref()
                .is_none_or(|w| w.heard_last_word(how));
            if heard || tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(LAST_WORD_LOOK).await;
        }
    }

    /// Says the service's warnings on the node not said yet. A read that fails says
    /// nothing (the next look reads again).
    async fn relay_warnings(&mut self, say: &Say) {
        let Some(warnings) = self.warnings.as_mut() else {
            return;
        };
        if let Some(events) = node_events(&self.client, &self.node).await {
            for line in warnings.observe(&events) {
                say(&line);
            }
        }
    }
}

/// The Events about `node` (a Node's Events live in the default namespace), at most
/// [`NODE_EVENTS_READ`]. `None` when they cannot be read (RBAC, the API server).
async fn node_events(client: &kube::Client, node: &str) -> Option<Vec<EventV1>> {
    let api: Api<EventV1> = Api::namespaced(client.clone(), "default");
    let params = ListParams::default()
        .fields(&format!("regarding.name={node}"))
        .limit(NODE_EVENTS_READ);
    match api.list(&params).await {
        Ok(list) => Some(list.items),
        Err(e) => {
            tracing::debug!(node, error = %e, "cannot read the node's Events; its warnings are not relayed");
            None
        }
    }
}

/// How many of a node's Events one look reads.
const NODE_EVENTS_READ: u32 = 500;
