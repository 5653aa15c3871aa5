//! What each cluster-autoscaler minor the project supports does around the externalgrpc
//! protocol, as the suite's CA-shaped client (`tests/e2e/driver.rs`) plays it. Each
//! profile names the release it follows and, for every behaviour, the file and function
//! of kubernetes/autoscaler (under `cluster-autoscaler/`) at that release's tag where the
//! behaviour lives. Read at the tags on 2026-11-25; the facts are summarised in
//! ../shared/protocol.md. Nothing upstream is copied here: these are our own words.
#![allow(dead_code)] // shared by the e2e test crates, each using a part

use std::time::Duration;

/// How CA reads `NodeGroupTemplateNodeInfoResponse`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TemplateRead {
    /// Field 1 only, as an embedded v1.Node (<= 1.34.1).
    Field1,
    /// `nodeBytes` (field 2) when present, else field 1 (1.34.2 to 1.34.x).
    PreferBytes,
    /// `nodeBytes` only (>= 1.35).
    BytesOnly,
}

/// Which Duration fields of `NodeGroupAutoscalingOptions` CA sends and reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durations {
    /// Fields 3-5 (`k8s.io.apimachinery` meta Duration, nanoseconds) only (<= 1.33).
    Meta,
    /// Both sets sent; 8-10 read first, 3-5 when 8-10 are absent (1.34).
    Both,
    /// Fields 8-10 (`google.protobuf.Duration`) only (>= 1.35).
    Google,
}

/// One behaviour and where CA has it.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    pub behaviour: &'static str,
    pub file: &'static str,
    pub function: &'static str,
}

#[derive(Debug)]
pub struct CaProfile {
    /// "1.31", "1.34", "1.36", "master".
    pub name: &'static str,
    /// The release the profile follows ("1.36.1"; for master the snapshot's commit).
    pub release: &'static str,
    /// Where to read it: the tag, or the commit of master.
    pub tag: &'static str,
    /// `(minor, patch)` of the release; master counts as 1.37.0.
    pub version: (u32, u32),
    /// `--cordon-node-before-terminating`'s default: cordon together with the
    /// `ToBeDeletedByClusterAutoscaler` taint, and uncordon when the taint is cleaned.
    pub cordons: bool,
    pub template: TemplateRead,
    pub durations: Durations,
    /// Lists and watches deviceclasses, resourceclaims, resourceslices
    /// (resource.k8s.io/v1) and waits for them before its first loop.
    pub dra_watches: bool,
    /// `--max-scale-down-parallelism`'s default.
    pub max_scale_down_parallelism: usize,
    /// cloud-config `grpc_timeout`'s default: every call carries it as its deadline.
    pub grpc_timeout: Duration,
    /// Where the release has what the client does its own way, beside [`COMMON`].
    pub sources: &'static [Source],
}

const fn src(behaviour: &'static str, file: &'static str, function: &'static str) -> Source {
    Source {
        behaviour,
        file,
        function,
    }
}

/// From 1.34: cordon with the taint.
const CORDONS: Source = src(
    "--cordon-node-before-terminating defaults to true: cordon with the taint",
    "config/flags/flags.go",
    "flag cordon-node-before-terminating",
);

/// Where every version 1.31 to master keeps what the client does the same way.
const COMMON: [Source; 7] = [
    src(
        "taint the nodes of a scale-down synchronously, then delete each in its own goroutine",
        "core/scaledown/actuation/actuator.go",
        "Actuator.taintNodesSync, Actuator.deleteNodesAsync",
    ),
    src(
        "NodeGroupGetOptions before each node's deletion; an error other than Unimplemented aborts that node's deletion and cleans its taint",
        "core/scaledown/actuation/group_deletion_scheduler.go",
        "GroupDeletionScheduler.ScheduleDeletion / scheduleDeletion, AbortNodeDeletion*",
    ),
    src(
        "one NodeGroupDeleteNodes per node with the default --node-deletion-batcher-interval=0; a failed call cleans the node's taint",
        "core/scaledown/actuation/delete_in_batch.go",
        "NodeDeletionBatcher.AddNodes, CleanUpAndRecordFailedScaleDownEvent",
    ),
    src(
        "the taint (and, with the cordon flag, spec.unschedulable) in one node Update; cleaning removes both",
        "utils/taints/taints.go",
        "MarkToBeDeleted, AddTaints, CleanToBeDeleted, CleanTaints",
    ),
    src(
        "at start, clean the taint from every node of the selected groups",
        "core/static_autoscaler.go",
        "StaticAutoscaler.cleanUpIfRequired -> taints.CleanAllToBeDeleted",
    ),
    src(
        "errored instances (placeholders) are deleted each loop; unregistered ones only above min",
        "core/static_autoscaler.go",
        "deleteCreatedNodesWithErrors, removeOldUnregisteredNodes",
    ),
    src(
        "every call under the cloud-config grpc_timeout (5 s)",
        "cloudprovider/externalgrpc/externalgrpc_cloud_provider.go, externalgrpc_node_group.go",
        "externalGrpcCloudProvider.grpcTimeout, context.WithTimeout in every call",
    ),
];

/// Beside [`COMMON`], where 1.31 to 1.33 have what the client does their way.
const SOURCES_1_31: [Source; 3] = [
    src(
        "--cordon-node-before-terminating defaults to false: taint only",
        "main.go",
        "flag cordon-node-before-terminating",
    ),
    src(
        "the template read from field 1 (embedded v1.Node)",
        "cloudprovider/externalgrpc/externalgrpc_node_group.go",
        "NodeGroup.TemplateNodeInfo (res.GetNodeInfo)",
    ),
    src(
        "options sent and read as meta Durations, fields 3-5",
        "cloudprovider/externalgrpc/externalgrpc_node_group.go",
        "NodeGroup.GetOptions",
    ),
];

/// Beside [`COMMON`], where 1.34 has what the client does its way.
const SOURCES_1_34: [Source; 3] = [
    CORDONS,
    src(
        "the template read from nodeBytes when set, else field 1 (from 1.34.2)",
        "cloudprovider/externalgrpc/externalgrpc_node_group.go",
        "NodeGroup.TemplateNodeInfo (res.GetNodeBytes, then res.GetNodeInfo)",
    ),
    src(
        "options sent in both Duration sets; fields 8-10 read first, 3-5 as fallback",
        "cloudprovider/externalgrpc/externalgrpc_node_group.go",
        "NodeGroup.GetOptions",
    ),
];

/// Beside [`COMMON`], where 1.35 and later have what the client does their way.
const SOURCES_1_35_UP: [Source; 4] = [
    CORDONS,
    src(
        "the template read from nodeBytes only",
        "cloudprovider/externalgrpc/externalgrpc_node_group.go",
        "NodeGroup.TemplateNodeInfo (res.GetNodeBytes)",
    ),
    src(
        "options sent and read as google.protobuf.Duration, fields 8-10 only",
        "cloudprovider/externalgrpc/externalgrpc_node_group.go",
        "NodeGroup.GetOptions",
    ),
    src(
        "Dynamic Resource Allocation always on: list/watch deviceclasses, resourceclaims, resourceslices before the first loop",
        "simulator/dynamicresources/provider/provider.go",
        "NewProviderFromInformers (and config/flags/flags.go: enable-dynamic-resource-allocation locked to true)",
    ),
];

pub static CA_1_31: CaProfile = CaProfile::of(
    ("1.31", "1.31.5", "cluster-autoscaler-1.31.5"),
    (31, 5),
    &SOURCES_1_31,
);

pub static CA_1_34: CaProfile = CaProfile::of(
    ("1.34", "1.34.5", "cluster-autoscaler-1.34.5"),
    (34, 5),
    &SOURCES_1_34,
);

pub static CA_1_36: CaProfile = CaProfile::of(
    ("1.36", "1.36.1", "cluster-autoscaler-1.36.1"),
    (36, 1),
    &SOURCES_1_35_UP,
);

/// Master of 2026-08-22: CA's core moved to sigs.k8s.io/cluster-autoscaler (the same
/// behaviours as 1.36.1 in the same files there); the externalgrpc provider and its proto
/// stay in kubernetes/autoscaler, unchanged since 1.35.
pub static CA_MASTER: CaProfile = CaProfile::of(
    (
        "master",
        "master (55c37cd5eb55, 2026-08-22)",
        "55c37cd5eb550756c5ccc5a89e9068d77797e575",
    ),
    (37, 0),
    &SOURCES_1_35_UP,
);

/// Every profile, oldest first.
pub static ALL: [&CaProfile; 4] = [&CA_1_31, &CA_1_34, &CA_1_36, &CA_MASTER];

impl CaProfile {
    /// The behaviour the suite's client plays for any release number `1.minor.patch`
    /// (a real binary's version; `None` = a build from master).
    pub fn for_version(v: Option<(u64, u64, u64)>) -> CaProfile {
        let (minor, patch) = match v {
            Some((1, minor, patch)) => (minor as u32, patch as u32),
            _ => CA_MASTER.version,
        };
        let base: &CaProfile = match minor {
            ..=33 => &CA_1_31,
            34 => &CA_1_34,
            _ => &CA_1_36,
        };
        CaProfile::of(
            (base.name, base.release, base.tag),
            (minor, patch),
            base.sources,
        )
    }

    /// The profile of release `1.minor.patch` (`version`), named by `(name, release, tag)`
    /// and cited by `sources`: what it does follows from its version alone.
    const fn of(
        (name, release, tag): (&'static str, &'static str, &'static str),
        version: (u32, u32),
        sources: &'static [Source],
    ) -> CaProfile {
        let (minor, patch) = version;
        CaProfile {
            name,
            release,
            tag,
            version,
            cordons: minor >= 34,
            template: match (minor, patch) {
                (..=33, _) | (34, 0..=1) => TemplateRead::Field1,
                (34, _) => TemplateRead::PreferBytes,
                _ => TemplateRead::BytesOnly,
            },
            durations: match minor {
                ..=33 => Durations::Meta,
                34 => Durations::Both,
                _ => Durations::Google,
            },
            dra_watches: minor >= 35,
            max_scale_down_parallelism: 10,
            grpc_timeout: Duration::from_secs(5),
            sources,
        }
    }

    /// How the report's `driver` column names the client playing this profile.
    pub fn driver(&self) -> String {
        format!("suite client as CA {}", self.name)
    }

    /// The profile's sources ([`COMMON`]'s, then its own), one per line, for a failure
    /// message or the docs.
    pub fn cite(&self) -> String {
        COMMON
            .iter()
            .chain(self.sources)
            .map(|s| {
                format!(
                    "  {}: {} ({} at {})",
                    s.behaviour, s.function, s.file, self.tag
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_versions_map_to_the_behaviour_of_their_release() {
        let p = CaProfile::for_version(Some((1, 34, 1)));
        assert!(p.cordons);
        assert_eq!(p.template, TemplateRead::Field1);
        assert_eq!(
            CaProfile::for_version(Some((1, 34, 2))).template,
            TemplateRead::PreferBytes
        );
        let p = CaProfile::for_version(Some((1, 33, 6)));
        assert!(!p.cordons && !p.dra_watches);
        assert_eq!(p.durations, Durations::Meta);
        let p = CaProfile::for_version(Some((1, 35, 0)));
        assert!(p.dra_watches);
        assert_eq!(p.template, TemplateRead::BytesOnly);
        assert!(CaProfile::for_version(None).dra_watches);
        for p in ALL {
            let again = CaProfile::for_version(Some((1, p.version.0 as u64, p.version.1 as u64)));
            assert_eq!(
                (
                    again.cordons,
                    again.template,
                    again.durations,
                    again.dra_watches
                ),
                (p.cordons, p.template, p.durations, p.dra_watches),
                "{}",
                p.name
            );
        }
    }
}
