//! What cluster-autoscaler asks the API server for, per version: every informer it
//! starts (each a cluster-wide list and watch) and every request it makes itself, read
//! from CA's source at each tag and from the `k8s.io/kubernetes` release its `go.mod`
//! pins (the scheduler plugins CA runs in its simulations open their own informers on
//! CA's informer factory). Each entry names the file and function it comes from.
//!
//! The flags are those this project ships (docs/configuration.md "CA flags to set") on
//! top of CA's defaults: `--leader-elect=true`, `--write-status-configmap=true`,
//! `--expander=least-waste`, and every optional feature off (provisioning requests,
//! capacity buffers, capacity quotas, proactive scale-up, CSINode-aware scheduling).
//! What a feature turned on by a flag would add is said beside the site it would add to.
//!
//! How the list was read (2026-11-25), so that the next version is read the same way:
//! - CA's informer factory: every `informerFactory.<Group>().<Version>().<Kind>()`
//!   reached from `main.go` before `informerFactory.Start` (grep `Lister()` and
//!   `Informer()` outside `cloudprovider/`, `apis/`, tests). 1.34.5 and later wait for
//!   every one of them (`WaitForCacheSync`) before the first loop: one forbidden
//!   informer and CA never starts. 1.31.5 starts them without waiting (a forbidden one
//!   leaves its cache empty, and CA decides on that).
//! - The scheduler framework: the plugins of the default profile
//!   (`pkg/scheduler/apis/config/v1/default_plugins.go`, with the feature gates at their
//!   defaults in that release, except DynamicResourceAllocation, which CA sets from its
//!   own flag) and what each plugin's `New` asks of `SharedInformerFactory()`.
//! - CA's own calls: `ClientSet.CoreV1()...`, the event recorder, the leader-election
//!   lock, the status ConfigMap. CA never writes `pods/status`, never deletes a pod on
//!   these paths (its force-delete path, `Actuator.StartForceDeletion`, has no caller),
//!   and writes nothing in `resource.k8s.io`.
//!
//! Cross-checked once (2026-11-25) against the real binaries of 1.31.5, 1.34.5, 1.36.1
//! and master, each run for 45 s with these flags as a ServiceAccount allowed everything,
//! on a Kubernetes v1.37.2 API server with an audit log of every request: the informers
//! each opened are exactly the ones below (1.36 and master open them as watch-lists, a
//! `watch` only, and fall back to `list`); the start-up calls (the nodes list, the Lease,
//! the status ConfigMap and its delete on exit, the leader-election Event) too. A
//! scale-down (taints, evictions, pod gets, repeated Events) was not run there: those
//! come from the source only.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::collections::BTreeMap;
use std::fmt;

/// One API resource as CA's client addresses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Res {
    /// API group; "" is the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub resource: &'static str,
}

const fn res(group: &'static str, version: &'static str, resource: &'static str) -> Res {
    Res {
        group,
        version,
        resource,
    }
}

pub const NODES: Res = res("", "v1", "nodes");
pub const PODS: Res = res("", "v1", "pods");
pub const NAMESPACES: Res = res("", "v1", "namespaces");
pub const SERVICES: Res = res("", "v1", "services");
pub const REPLICATION_CONTROLLERS: Res = res("", "v1", "replicationcontrollers");
pub const PERSISTENT_VOLUMES: Res = res("", "v1", "persistentvolumes");
pub const PERSISTENT_VOLUME_CLAIMS: Res = res("", "v1", "persistentvolumeclaims");
pub const EVENTS: Res = res("", "v1", "events");
pub const CONFIG_MAPS: Res = res("", "v1", "configmaps");
pub const DAEMON_SETS: Res = res("apps", "v1", "daemonsets");
pub const REPLICA_SETS: Res = res("apps", "v1", "replicasets");
pub const STATEFUL_SETS: Res = res("apps", "v1", "statefulsets");
pub const JOBS: Res = res("batch", "v1", "jobs");
pub const POD_DISRUPTION_BUDGETS: Res = res("policy", "v1", "poddisruptionbudgets");
pub const STORAGE_CLASSES: Res = res("storage.k8s.io", "v1", "storageclasses");
pub const CSI_NODES: Res = res("storage.k8s.io", "v1", "csinodes");
pub const CSI_DRIVERS: Res = res("storage.k8s.io", "v1", "csidrivers");
pub const CSI_STORAGE_CAPACITIES: Res = res("storage.k8s.io", "v1", "csistoragecapacities");
pub const VOLUME_ATTACHMENTS: Res = res("storage.k8s.io", "v1", "volumeattachments");
pub const DEVICE_CLASSES: Res = res("resource.k8s.io", "v1", "deviceclasses");
pub const RESOURCE_CLAIMS: Res = res("resource.k8s.io", "v1", "resourceclaims");
pub const RESOURCE_SLICES: Res = res("resource.k8s.io", "v1", "resourceslices");
pub const LEASES: Res = res("coordination.k8s.io", "v1", "leases");

/// Where a permission applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Every namespace (or a cluster-scoped resource): only a ClusterRole grants it.
    Cluster,
    /// CA's namespace (`--namespace`), any name: a create, whose name RBAC cannot know.
    CaNamespace,
    /// CA's namespace, its leader-election Lease only (`--leader-elect-resource-name`).
    Lease,
    /// CA's namespace, its status ConfigMap only (`--status-config-map-name`).
    StatusConfigMap,
}

/// One permission CA needs: what a SubjectAccessReview asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Perm {
    pub verb: &'static str,
    pub res: Res,
    pub subresource: &'static str,
    pub scope: Scope,
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.res.group.is_empty() {
            "core"
        } else {
            self.res.group
        };
        write!(f, "{} {group}/{}", self.verb, self.res.resource)?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        match self.scope {
            Scope::Cluster => write!(f, " (every namespace)"),
            Scope::CaNamespace => write!(f, " (CA's namespace)"),
            Scope::Lease => write!(f, " (CA's namespace, its Lease by name)"),
            Scope::StatusConfigMap => write!(f, " (CA's namespace, its status ConfigMap by name)"),
        }
    }
}

/// A request CA makes itself.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub verb: &'static str,
    pub res: Res,
    pub subresource: &'static str,
    pub scope: Scope,
}

const fn call(verb: &'static str, res: Res, scope: Scope) -> Call {
    Call {
        verb,
        res,
        subresource: "",
        scope,
    }
}

/// Which tree a site's path is in (the roots are per version, `CaVersion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tree {
    /// CA's `main` package (kubernetes/autoscaler `cluster-autoscaler/`).
    Main,
    /// CA's core (the same tree up to 1.36; on master `sigs.k8s.io/cluster-autoscaler`).
    Core,
    /// `k8s.io/kubernetes` at the release CA's `go.mod` pins.
    Kubernetes,
}

/// One place in the source that asks the API server for something.
#[derive(Clone, Copy, Debug)]
pub struct Site {
    pub tree: Tree,
    /// File and function under the tree's root.
    pub at: &'static str,
    /// Informers it registers on CA's factory: each a cluster-wide list and watch.
    pub watches: &'static [Res],
    /// Requests it makes itself.
    pub calls: &'static [Call],
}

const fn informers(tree: Tree, at: &'static str, watches: &'static [Res]) -> Site {
    Site {
        tree,
        at,
        watches,
        calls: &[],
    }
}

const fn calls(tree: Tree, at: &'static str, calls: &'static [Call]) -> Site {
    Site {
        tree,
        at,
        watches: &[],
        calls,
    }
}

// ---------------------------------------------------------------- CA's own sites
// The same files and functions from 1.31.5 to master (under the version's Core root).

const LISTERS: Site = informers(
    Tree::Core,
    "utils/kubernetes/listers.go NewListerRegistryWithDefaultListers",
    &[
        PODS,
        NODES,
        POD_DISRUPTION_BUDGETS,
        DAEMON_SETS,
        REPLICATION_CONTROLLERS,
        JOBS,
        REPLICA_SETS,
        STATEFUL_SETS,
    ],
);

/// Its own list/watch of unschedulable pods (a field selector), to start a loop early.
const POD_OBSERVER: Site = informers(Tree::Core, "loop/trigger.go StartPodObserver", &[PODS]);

/// client-go's recorder: a new Event is a create, a repeated one a patch of its count.
const EVENT_RECORDER: Site = calls(
    Tree::Core,
    "utils/kubernetes/factory.go CreateEventRecorder",
    &[
        call("create", EVENTS, Scope::Cluster),
        call("patch", EVENTS, Scope::Cluster),
    ],
);

/// ToBeDeletedByClusterAutoscaler / DeletionCandidate taints (and from 1.34 the cordon):
/// a fresh get of the Node, then an update.
const TAINTS: Site = calls(
    Tree::Core,
    "utils/taints/taints.go AddTaints, CleanTaints",
    &[
        call("get", NODES, Scope::Cluster),
        call("update", NODES, Scope::Cluster),
    ],
);

const EVICT: Site = calls(
    Tree::Core,
    "core/scaledown/actuation/drain.go Evictor.evictPod",
    &[Call {
        verb: "create",
        res: PODS,
        subresource: "eviction",
        scope: Scope::Cluster,
    }],
);

const WAIT_PODS_GONE: Site = calls(
    Tree::Core,
    "core/scaledown/actuation/drain.go Evictor.waitPodsToDisappear",
    &[call("get", PODS, Scope::Cluster)],
);

/// Get, then update, or create when it is missing.
const STATUS_WRITE: Site = calls(
    Tree::Core,
    "clusterstate/utils/status.go WriteStatusConfigMap",
    &[
        call("get", CONFIG_MAPS, Scope::StatusConfigMap),
        call("update", CONFIG_MAPS, Scope::StatusConfigMap),
        call("create", CONFIG_MAPS, Scope::CaNamespace),
    ],
);

/// On exit (`ExitCleanUp`).
const STATUS_DELETE: Site = calls(
    Tree::Core,
    "clusterstate/utils/status.go DeleteStatusConfigMap",
    &[call("delete", CONFIG_MAPS, Scope::StatusConfigMap)],
);

/// `--leader-elect` (default true) with client-go's Lease lock in `--namespace`.
const LEADER_ELECTION: Site = calls(
    Tree::Main,
    "main.go main (resourcelock.New with LeasesResourceLock, then leaderelection.RunOrDie)",
    &[
        call("get", LEASES, Scope::Lease),
        call("create", LEASES, Scope::CaNamespace),
        call("update", LEASES, Scope::Lease),
    ],
);

/// Before the leader election: one list of nodes to check the client works.
const CLIENT_CHECK: Site = calls(
    Tree::Main,
    "main.go main (\"Failed to get nodes from apiserver\")",
    &[call("list", NODES, Scope::Cluster)],
);

/// 1.35 and later: `--enable-dynamic-resource-allocation` is locked to true, and
/// `initializeDefaultOptions` builds this provider from the informer factory. (1.34 has
/// the same code behind the flag, default false.)
const DRA_PROVIDER: Site = informers(
    Tree::Core,
    "simulator/dynamicresources/provider/provider.go NewProviderFromInformers",
    &[RESOURCE_CLAIMS, RESOURCE_SLICES, DEVICE_CLASSES],
);

/// 1.35 and later: the CSINode lister behind the scheduler's CSI manager.
const CSI_MANAGER: Site = informers(
    Tree::Core,
    "simulator/framework/handle.go NewHandle (nodevolumelimits.NewCSIManager)",
    &[CSI_NODES],
);

const CA_OWN: [Site; 10] = [
    LISTERS,
    POD_OBSERVER,
    EVENT_RECORDER,
    TAINTS,
    EVICT,
    WAIT_PODS_GONE,
    STATUS_WRITE,
    STATUS_DELETE,
    LEADER_ELECTION,
    CLIENT_CHECK,
];

// ---------------------------------------------------------------- scheduler plugins
// Under the version's Kubernetes root: each plugin's `New`, as CA's framework handle
// builds the default profile with CA's informer factory.

const VOLUME_BINDING: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/volumebinding/volume_binding.go New",
    &[
        PODS,
        NODES,
        PERSISTENT_VOLUME_CLAIMS,
        PERSISTENT_VOLUMES,
        STORAGE_CLASSES,
        CSI_NODES,
        CSI_DRIVERS,
        CSI_STORAGE_CAPACITIES,
    ],
);

const VOLUME_ZONE: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/volumezone/volume_zone.go New",
    &[
        PERSISTENT_VOLUMES,
        PERSISTENT_VOLUME_CLAIMS,
        STORAGE_CLASSES,
    ],
);

const VOLUME_RESTRICTIONS: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/volumerestrictions/volume_restrictions.go New",
    &[PERSISTENT_VOLUME_CLAIMS],
);

const INTER_POD_AFFINITY: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/interpodaffinity/plugin.go New",
    &[NAMESPACES],
);

/// The system-default spreading constraints need the owners' selectors.
const POD_TOPOLOGY_SPREAD: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/podtopologyspread/plugin.go New (setListers)",
    &[
        SERVICES,
        REPLICATION_CONTROLLERS,
        REPLICA_SETS,
        STATEFUL_SETS,
    ],
);

const NODE_VOLUME_LIMITS_1_31: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/nodevolumelimits/csi.go NewCSI",
    &[
        PERSISTENT_VOLUMES,
        PERSISTENT_VOLUME_CLAIMS,
        CSI_NODES,
        STORAGE_CLASSES,
    ],
);

/// 1.34 adds the VolumeAttachment lister.
const NODE_VOLUME_LIMITS_1_34: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/nodevolumelimits/csi.go NewCSI",
    &[
        PERSISTENT_VOLUMES,
        PERSISTENT_VOLUME_CLAIMS,
        CSI_NODES,
        STORAGE_CLASSES,
        VOLUME_ATTACHMENTS,
    ],
);

/// 1.35 and 1.36: CSINodes come from the shared CSI manager (CSI_MANAGER); CSIDrivers
/// are new.
const NODE_VOLUME_LIMITS_1_35: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/nodevolumelimits/csi.go NewCSI",
    &[
        PERSISTENT_VOLUMES,
        PERSISTENT_VOLUME_CLAIMS,
        STORAGE_CLASSES,
        VOLUME_ATTACHMENTS,
        CSI_DRIVERS,
    ],
);

const DEFAULT_PREEMPTION: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/plugins/defaultpreemption/default_preemption.go New",
    &[PODS, POD_DISRUPTION_BUDGETS],
);

/// 1.35 and 1.36: DefaultPreemption's evaluator holds the listers.
const PREEMPTION_EVALUATOR: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/preemption/preemption.go NewEvaluator",
    &[PODS, POD_DISRUPTION_BUDGETS],
);

const PREEMPTION_EXECUTOR: Site = informers(
    Tree::Kubernetes,
    "pkg/scheduler/framework/preemption/executor.go NewExecutor",
    &[PODS],
);

// ---------------------------------------------------------------- the versions

/// One cluster-autoscaler version and where its needs were read.
pub struct CaVersion {
    /// "1.36.1", or "master".
    pub name: &'static str,
    /// The roots of `Tree::Main`, `Tree::Core` and `Tree::Kubernetes`.
    pub main_root: &'static str,
    pub core_root: &'static str,
    pub kubernetes_root: &'static str,
    /// Where CA builds the scheduler framework whose plugins open the Kubernetes sites.
    pub scheduler_entry: &'static str,
    /// Its sites, in groups (CA's own, what a version added, the scheduler plugins).
    pub sites: &'static [&'static [Site]],
}

impl CaVersion {
    /// Every permission this version needs, each with the sites that need it
    /// ("root + file function").
    pub fn needs(&self) -> BTreeMap<Perm, Vec<String>> {
        let mut out: BTreeMap<Perm, Vec<String>> = BTreeMap::new();
        for site in self.sites.iter().flat_map(|group| group.iter()) {
            let at = self.cite(site);
            let mut add = |p: Perm| {
                let from = out.entry(p).or_default();
                if !from.contains(&at) {
                    from.push(at.clone());
                }
            };
            for &r in site.watches {
                for verb in ["list", "watch"] {
                    add(Perm {
                        verb,
                        res: r,
                        subresource: "",
                        scope: Scope::Cluster,
                    });
                }
            }
            for c in site.calls {
                add(Perm {
                    verb: c.verb,
                    res: c.res,
                    subresource: c.subresource,
                    scope: c.scope,
                });
            }
        }
        out
    }

    /// Where a site is, in full.
    pub fn cite(&self, site: &Site) -> String {
        match site.tree {
            Tree::Main => format!("{}{}", self.main_root, site.at),
            Tree::Core => format!("{}{}", self.core_root, site.at),
            Tree::Kubernetes => format!(
                "{}{} (through {}{})",
                self.kubernetes_root, site.at, self.core_root, self.scheduler_entry
            ),
        }
    }
}

/// The plugins of the default profile, per Kubernetes release.
const PLUGINS_1_31: [Site; 7] = [
    VOLUME_BINDING,
    VOLUME_ZONE,
    VOLUME_RESTRICTIONS,
    INTER_POD_AFFINITY,
    POD_TOPOLOGY_SPREAD,
    NODE_VOLUME_LIMITS_1_31,
    DEFAULT_PREEMPTION,
];

const PLUGINS_1_34: [Site; 7] = [
    VOLUME_BINDING,
    VOLUME_ZONE,
    VOLUME_RESTRICTIONS,
    INTER_POD_AFFINITY,
    POD_TOPOLOGY_SPREAD,
    NODE_VOLUME_LIMITS_1_34,
    DEFAULT_PREEMPTION,
];

const PLUGINS_1_35: [Site; 7] = [
    VOLUME_BINDING,
    VOLUME_ZONE,
    VOLUME_RESTRICTIONS,
    INTER_POD_AFFINITY,
    POD_TOPOLOGY_SPREAD,
    NODE_VOLUME_LIMITS_1_35,
    PREEMPTION_EVALUATOR,
];

const PLUGINS_1_36: [Site; 8] = [
    VOLUME_BINDING,
    VOLUME_ZONE,
    VOLUME_RESTRICTIONS,
    INTER_POD_AFFINITY,
    POD_TOPOLOGY_SPREAD,
    NODE_VOLUME_LIMITS_1_35,
    PREEMPTION_EVALUATOR,
    PREEMPTION_EXECUTOR,
];

/// What 1.35 added to CA's own sites.
const CA_1_35: [Site; 2] = [DRA_PROVIDER, CSI_MANAGER];

/// The versions, oldest first: the profiles of the end-to-end suite (1.31, 1.34, 1.36,
/// master) and 1.35, the first that needs `resource.k8s.io`.
pub const VERSIONS: &[CaVersion] = &[
    CaVersion {
        name: "1.31.5",
        main_root: "kubernetes/autoscaler@cluster-autoscaler-1.31.5:cluster-autoscaler/",
        core_root: "kubernetes/autoscaler@cluster-autoscaler-1.31.5:cluster-autoscaler/",
        kubernetes_root: "k8s.io/kubernetes@v1.31.13 (vendored):",
        scheduler_entry:
            "simulator/predicatechecker/schedulerbased.go NewSchedulerBasedPredicateChecker",
        sites: &[&CA_OWN, &PLUGINS_1_31],
    },
    CaVersion {
        name: "1.34.5",
        main_root: "kubernetes/autoscaler@cluster-autoscaler-1.34.5:cluster-autoscaler/",
        core_root: "kubernetes/autoscaler@cluster-autoscaler-1.34.5:cluster-autoscaler/",
        kubernetes_root: "k8s.io/kubernetes@v1.34.9:",
        scheduler_entry: "simulator/framework/handle.go NewHandle",
        sites: &[&CA_OWN, &PLUGINS_1_34],
    },
    CaVersion {
        name: "1.35.2",
        main_root: "kubernetes/autoscaler@cluster-autoscaler-1.35.2:cluster-autoscaler/",
        core_root: "kubernetes/autoscaler@cluster-autoscaler-1.35.2:cluster-autoscaler/",
        kubernetes_root: "k8s.io/kubernetes@v1.35.6:",
        scheduler_entry: "simulator/framework/handle.go NewHandle",
        sites: &[&CA_OWN, &CA_1_35, &PLUGINS_1_35],
    },
    CaVersion {
        name: "1.36.1",
        main_root: "kubernetes/autoscaler@cluster-autoscaler-1.36.1:cluster-autoscaler/",
        core_root: "kubernetes/autoscaler@cluster-autoscaler-1.36.1:cluster-autoscaler/",
        kubernetes_root: "k8s.io/kubernetes@v1.36.2:",
        scheduler_entry: "simulator/framework/handle.go NewHandle",
        sites: &[&CA_OWN, &CA_1_35, &PLUGINS_1_36],
    },
    CaVersion {
        name: "master",
        // master 55c37cd5eb55 (2026-08-22): the main package stays in kubernetes/autoscaler,
        // the core moved to sigs.k8s.io/cluster-autoscaler (its go.mod pins 6e285e0f4b4f).
        main_root: "kubernetes/autoscaler@55c37cd5eb55:cluster-autoscaler/",
        core_root: "kubernetes-sigs/cluster-autoscaler@6e285e0f4b4f:pkg/",
        kubernetes_root: "k8s.io/kubernetes@v1.36.2:",
        scheduler_entry: "simulator/framework/handle.go NewHandle",
        sites: &[&CA_OWN, &CA_1_35, &PLUGINS_1_36],
    },
];

/// CA's defaults for the names and namespace its Role must match.
pub const DEFAULT_NAMESPACE: &str = "kube-system";
pub const DEFAULT_LEASE: &str = "cluster-autoscaler";
pub const DEFAULT_STATUS_CONFIG_MAP: &str = "cluster-autoscaler-status";
