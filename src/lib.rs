//! ca-asg-provider: a cluster-autoscaler externalgrpc cloud provider for EC2 Auto
//! Scaling Groups with a DaemonSet-last, PDB-safe scale-in drain.

pub mod clock;
pub mod cloud;
pub mod commands;
pub mod config;
pub mod duration;
pub mod grpc;
pub mod h2_authority;
pub mod provider;
pub mod scalein;
pub mod sim;
pub mod telemetry;
pub mod world;

/// Code generated from proto/externalgrpc.proto.
pub mod proto {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("clusterautoscaler.cloudprovider.v1.externalgrpc");

    pub mod codec;
}
