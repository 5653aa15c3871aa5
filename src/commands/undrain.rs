//! `ca-asg-provider undrain NODE`: gives a node back after an abandoned or interrupted
//! drain. It removes exactly this service's marks (the `ca-asg-provider.io/draining`
//! taint, the drain record's annotations, the LB-exclusion label when the drain added
//! it, and the cordon only when the record says this service made it), and only when
//! no drain runs for the node ([`crate::scalein::decide::undo`]). An operator's
//! cordon, cluster-autoscaler's taint and every other taint stay.
//!
//! `undrain --all` gives back every Node that carries a mark, one by one as above:
//! `helm uninstall`'s post-delete Job runs it with `--force` once the replicas are gone
//! (no drainer is left to finish those drains), before it removes the lifecycle hooks.
//!
//! Its own subcommand, not `drain --undo`: it takes none of `drain`'s flags (no AWS,
//! no `--terminate`), needs only `get` and `patch` on Nodes, and has its own exit
//! codes.

use std::path::PathBuf;
use std::process::ExitCode;

use chrono::{DateTime, Utc};
use clap::Args;

use crate::config::ConfigArgs;
use crate::scalein::decide::ca_hold::{HELD_BY, SCALE_DOWN_DISABLED};
use crate::scalein::decide::conditions;
use crate::scalein::decide::record::CA_TO_BE_DELETED_TAINT;
use crate::scalein::decide::undo::{self, Running, Undo, Window};
use crate::scalein::kube::node_record::{read_modify_write_from, Write};
use crate::scalein::kube::user_agent;
use crate::scalein::stages::cordon::{give_back_patch, has_marks, GiveBackOf, GivenBack};

/// Exit code: a drain runs (or may) for the node; nothing changed.
pub const REFUSED: u8 = 3;

#[derive(Debug, Args, Clone)]
#[command(
    after_help = "Exit codes: 0 given back (or nothing of this service's was on the node; with \
--all: on any node); 1 the node is not found or the cluster cannot be read or written; 2 the \
configuration is invalid; 3 refused: a drain runs (or may) for the node (with --all: for one of \
them), nothing changed on it."
)]
pub struct UndrainArgs {
    /// The Node to give back.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub node: Option<String>,
    /// Every Node that carries a mark of this service, instead of one (at uninstall,
    /// with --force, once no replica is left).
    #[arg(long)]
    pub all: bool,
    /// Give it back even while the record says a drain runs for it (the service is
    /// stopped, or the `drain` command was interrupted).
    #[arg(long)]
    pub force: bool,
    /// The service's configuration file, for the deadlines that bound how long a
    /// drain may still run (the defaults without one).
    #[arg(long, short = 'c', env = "CA_ASG_PROVIDER_CONFIG")]
    pub config: Option<PathBuf>,
}

/// What `undrain` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undone {
    /// The marks are gone; the node's cordon as the patch left it.
    GivenBack {
        given: GivenBack,
        /// Cluster-autoscaler's deletion taint is on the node (and stays).
        ca_taint: bool,
    },
    /// Nothing of this service's was on the node.
    NothingToDo,
    /// A drain runs (or may): nothing changed.
    Refused(Running),
    /// The annotation that kept the node out of cluster-autoscaler's scale-down,
    /// with our mark, is removed (`--all` only).
    Released,
}

impl Undone {
    /// The answer printed, and the exit code.
    pub fn say(&self, node: &str) -> (String, ExitCode) {
        match self {
            Undone::NothingToDo => (
                format!("node {node} carries no mark of ca-asg-provider: nothing to give back"),
                ExitCode::SUCCESS,
            ),
            Undone::Refused(r) => (r.sentence(node), ExitCode::from(REFUSED)),
            Undone::Released => (
                format!("node {node} given back to cluster-autoscaler's scale-down: the {SCALE_DOWN_DISABLED} annotation this service set (with its mark {HELD_BY}) is removed"),
                ExitCode::SUCCESS,
            ),
            Undone::GivenBack { given, ca_taint } => {
                let mut s = format!("node {node} given back: the ca-asg-provider.io/draining taint and the drain record are removed");
                match given {
                    GivenBack::Schedulable => s.push_str("; it is schedulable"),
                    GivenBack::CordonKept => s.push_str(&format!(
                        "; it stays cordoned, as that cordon is not this service's (an operator's, another tool's or cluster-autoscaler's): `kubectl uncordon {node}` if it is not wanted"
                    )),
                }
                if *ca_taint {
                    s.push_str(&format!(
                        "; cluster-autoscaler's {CA_TO_BE_DELETED_TAINT} taint stays (CA removes it when it gives up the scale-down; `kubectl taint node {node} {CA_TO_BE_DELETED_TAINT}-` if CA is gone)"
                    ));
                }
                (s, ExitCode::SUCCESS)
            }
        }
    }
}

/// Gives `node` back through `client`, deciding at `now` (and again on every read a
/// conflicting write makes it take). `Ok(None)`: there is no such Node.
pub async fn undrain(
    client: &kube::Client,
    node: &str,
    window: Window,
    force: bool,
    now: DateTime<Utc>,
) -> Result<Option<Undone>, kube::Error> {
    let undone = read_modify_write_from(None, client, node, |current| {
        if !has_marks(current) {
            return Write::Keep(Undone::NothingToDo);
        }
        let annotations = current.metadata.annotations.clone().unwrap_or_default();
        if let (Undo::Refuse(running), false) = (undo::decide(&annotations, window, now), force) {
            return Write::Keep(Undone::Refused(running));
        }
        let (patch, given) = give_back_patch(current, GiveBackOf::ServiceOnly);
        let ca_taint = current
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == CA_TO_BE_DELETED_TAINT));
        Write::Patch(patch, Undone::GivenBack { given, ca_taint })
    })
    .await?;
    if matches!(undone, Some(Undone::GivenBack { .. } | Undone::NothingToDo)) {
        clear_conditions(client, node).await;
    }
    Ok(undone)
}

/// A node given back (or found without marks) says no drain on it any more: its
/// `DrainInProgress` and `Drained` conditions go False, when it has them.
async fn clear_conditions(client: &kube::Client, node: &str) {
    let api: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let Ok(Some(current)) = api.get_opt(node).await else {
        return;
    };
    let has = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == conditions::DRAIN_IN_PROGRESS || c.type_ == conditions::DRAINED)
        });
    if !has {
        return;
    }
    let state = conditions::DrainState::Stopped {
        reason: "DrainUndone",
        message: "given back by undrain: no drain runs on this node".into(),
    };
    crate::scalein::kube::conditions::say(client, Some(&current), node, &state).await;
}

/// Gives back every Node that carries a mark of this service, in name order, each as
/// [`undrain`] does: what was done (or refused) on each. Nodes without a mark are not
/// touched (only read, by one list). Then every Node this service kept out of
/// cluster-autoscaler's scale-down is released (an operator's own annotation stays).
pub async fn undrain_all(
    client: &kube::Client,
    window: Window,
    force: bool,
    now: DateTime<Utc>,
) -> Result<Vec<(String, Undone)>, kube::Error> {
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(client.clone());
    let listed = nodes.list(&kube::api::ListParams::default()).await?;
    let mut marked: Vec<String> = listed
        .items
        .iter()
        .filter(|n| has_marks(n))
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    marked.sort();
    let mut done = Vec::new();
    for name in marked {
        // A node deleted since the list has nothing left to give back.
        if let Some(d) = undrain(client, &name, window, force, now).await? {
            done.push((name, d));
        }
    }
    for name in crate::scalein::kube::ca_hold::release_all(client).await? {
        done.push((name, Undone::Released));
    }
    Ok(done)
}

/// What `undrain --all` prints, and its exit code: a line per node, then the count.
pub fn say_all(done: &[(String, Undone)]) -> (Vec<(bool, String)>, ExitCode) {
    let mut lines = Vec::new();
    let mut refused = 0;
    let mut given = 0;
    let mut released = 0;
    for (node, d) in done {
        let (text, code) = d.say(node);
        let ok = code == ExitCode::SUCCESS;
        match d {
            Undone::GivenBack { .. } => given += 1,
            Undone::Refused(_) => refused += 1,
            Undone::Released => released += 1,
            Undone::NothingToDo => {}
        }
        lines.push((ok, text));
    }
    let summary = if done.is_empty() {
        "no node carries a mark of ca-asg-provider: nothing to give back".to_string()
    } else {
        format!("{given} node(s) given back, {refused} refused (a drain runs or may run for them)")
    };
    let summary = if released > 0 {
        format!("{summary}; {released} node(s) given back to cluster-autoscaler's scale-down")
    } else {
        summary
    };
    lines.push((refused == 0, summary));
    let code = if refused == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(REFUSED)
    };
    (lines, code)
}

pub async fn run(args: UndrainArgs) -> ExitCode {
    let cfg = match ConfigArgs::load_file(args.config.as_ref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let s = &cfg.scale_in;
    let window = Window {
        limits: s.limits(),
        after_deadline: s.daemonset_deadline + s.volume_deadline,
    };
    let client = match user_agent::client_for(user_agent::UNDRAIN).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let Some(node) = args.node.filter(|_| !args.all) else {
        return match undrain_all(&client, window, args.force, crate::clock::utc_now()).await {
            Ok(done) => {
                let (lines, code) = say_all(&done);
                for (ok, text) in lines {
                    if ok {
                        println!("{text}");
                    } else {
                        eprintln!("{text}");
                    }
                }
                code
            }
            Err(e) => {
                eprintln!(
                    "error: cannot give the nodes back through the Kubernetes API server: {e}"
                );
                ExitCode::FAILURE
            }
        };
    };
    match undrain(&client, &node, window, args.force, crate::clock::utc_now()).await {
        Ok(Some(done)) => {
            let (text, code) = done.say(&node);
            if code == ExitCode::SUCCESS {
                println!("{text}");
            } else {
                eprintln!("{text}");
            }
            code
        }
        Ok(None) => {
            eprintln!("error: node {node} not found");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: cannot give node {node} back through the Kubernetes API server: {e}");
            ExitCode::FAILURE
        }
    }
}
