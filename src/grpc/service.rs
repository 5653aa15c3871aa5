//! One method per RPC. Hot RPCs answer from the core's memory; none waits on a drain.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::proto::{
    self, cloud_provider_server::CloudProvider, instance_status::InstanceState as PbState,
};
use crate::provider::options::AutoscalingOptions;
use crate::provider::{instances, ErrorKind, GroupInfo, NodeRef, Provider, ProviderError};

use super::options::{from_proto, to_proto};

pub struct CloudProviderService {
    provider: Arc<Provider>,
}

impl CloudProviderService {
    pub fn new(provider: Arc<Provider>) -> Self {
        Self { provider }
    }
}

/// Longest status message sent: values from requests are capped where they are
/// echoed; this bounds whatever else a message carries (AWS's own texts).
const STATUS_MESSAGE_MAX: usize = 2048;

/// Maps core errors to gRPC codes. CA logs the message, so it carries the numbers.
pub fn status(e: ProviderError) -> Status {
    let s = status_uncapped(e);
    if s.message().len() <= STATUS_MESSAGE_MAX {
        return s;
    }
    let mut cut = STATUS_MESSAGE_MAX;
    while !s.message().is_char_boundary(cut) {
        cut -= 1;
    }
    Status::new(s.code(), format!("{}... (truncated)", &s.message()[..cut]))
}

fn status_uncapped(e: ProviderError) -> Status {
    let message = e.to_string();
    match e.kind() {
        ErrorKind::UnknownGroup | ErrorKind::NotFound => Status::not_found(message),
        ErrorKind::InvalidArgument => Status::invalid_argument(message),
        ErrorKind::FailedPrecondition => Status::failed_precondition(message),
        ErrorKind::Unavailable => Status::unavailable(message),
        ErrorKind::Unimplemented => Status::unimplemented(message),
    }
}

fn group_pb(g: GroupInfo) -> proto::NodeGroup {
    proto::NodeGroup {
        id: g.id,
        min_size: g.min,
        max_size: g.max,
        debug: g.debug,
    }
}

fn require_id(id: &str) -> Result<(), Status> {
    if id.is_empty() {
        return Err(Status::invalid_argument("field id: node group id is empty"));
    }
    Ok(())
}

fn node_ref(n: &proto::ExternalGrpcNode) -> NodeRef {
    NodeRef {
        provider_id: n.provider_id.clone(),
        name: n.name.clone(),
    }
}

/// CA's documented defaults, for durations CA did not send (CA 1.31 to 1.34 crash on
/// a missing duration in the answer; CA 1.35+ would read it as 0 s).
fn fill_defaults(o: &mut AutoscalingOptions) {
    let fill = |d: &mut Option<Duration>, secs| {
        if d.is_none() {
            *d = Some(Duration::from_secs(secs));
        }
    };
    fill(&mut o.scale_down_unneeded_time, 10 * 60);
    fill(&mut o.scale_down_unready_time, 20 * 60);
    fill(&mut o.max_node_provision_time, 15 * 60);
}

/// Each method does its own work only: [`super::metered`] counts and times them all.
#[tonic::async_trait]
impl CloudProvider for CloudProviderService {
    async fn node_groups(
        &self,
        _req: Request<proto::NodeGroupsRequest>,
    ) -> Result<Response<proto::NodeGroupsResponse>, Status> {
        let node_groups = self
            .provider
            .node_groups()
            .into_iter()
            .map(group_pb)
            .collect();
        Ok(Response::new(proto::NodeGroupsResponse { node_groups }))
    }

    async fn node_group_for_node(
        &self,
        req: Request<proto::NodeGroupForNodeRequest>,
    ) -> Result<Response<proto::NodeGroupForNodeResponse>, Status> {
        let node = req
            .into_inner()
            .node
            .ok_or_else(|| Status::invalid_argument("field node: missing"))?;
        let group = self
            .provider
            .group_for_node(&node_ref(&node))
            .map(group_pb)
            .unwrap_or_default();
        Ok(Response::new(proto::NodeGroupForNodeResponse {
            node_group: Some(group),
        }))
    }

    async fn pricing_node_price(
        &self,
        _req: Request<proto::PricingNodePriceRequest>,
    ) -> Result<Response<proto::PricingNodePriceResponse>, Status> {
        Err(Status::unimplemented(
            "pricing is not implemented by ca-asg-provider",
        ))
    }

    async fn pricing_pod_price(
        &self,
        _req: Request<proto::PricingPodPriceRequest>,
    ) -> Result<Response<proto::PricingPodPriceResponse>, Status> {
        Err(Status::unimplemented(
            "pricing is not implemented by ca-asg-provider",
        ))
    }

    async fn gpu_label(
        &self,
        _req: Request<proto::GpuLabelRequest>,
    ) -> Result<Response<proto::GpuLabelResponse>, Status> {
        Ok(Response::new(proto::GpuLabelResponse {
            label: Provider::GPU_LABEL.to_string(),
        }))
    }

    async fn get_available_gpu_types(
        &self,
        _req: Request<proto::GetAvailableGpuTypesRequest>,
    ) -> Result<Response<proto::GetAvailableGpuTypesResponse>, Status> {
        let gpu_types: HashMap<String, prost_types::Any> = self
            .provider
            .gpu_types()
            .into_iter()
            .map(|t| (t, prost_types::Any::default()))
            .collect();
        Ok(Response::new(proto::GetAvailableGpuTypesResponse {
            gpu_types,
        }))
    }

    async fn cleanup(
        &self,
        _req: Request<proto::CleanupRequest>,
    ) -> Result<Response<proto::CleanupResponse>, Status> {
        self.provider.cleanup();
        Ok(Response::new(proto::CleanupResponse {}))
    }

    async fn refresh(
        &self,
        _req: Request<proto::RefreshRequest>,
    ) -> Result<Response<proto::RefreshResponse>, Status> {
        self.provider.refresh().await.map_err(status)?;
        Ok(Response::new(proto::RefreshResponse {}))
    }

    async fn node_group_target_size(
        &self,
        req: Request<proto::NodeGroupTargetSizeRequest>,
    ) -> Result<Response<proto::NodeGroupTargetSizeResponse>, Status> {
        let id = req.into_inner().id;
        require_id(&id)?;
        let target_size = self.provider.target_size(&id).map_err(status)?;
        Ok(Response::new(proto::NodeGroupTargetSizeResponse {
            target_size,
        }))
    }

    async fn node_group_increase_size(
        &self,
        req: Request<proto::NodeGroupIncreaseSizeRequest>,
    ) -> Result<Response<proto::NodeGroupIncreaseSizeResponse>, Status> {
        let bound = answer_bound(&req);
        let r = req.into_inner();
        require_id(&r.id)?;
        self.provider
            .increase_size_within(&r.id, r.delta, bound)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::NodeGroupIncreaseSizeResponse {}))
    }

    async fn node_group_delete_nodes(
        &self,
        req: Request<proto::NodeGroupDeleteNodesRequest>,
    ) -> Result<Response<proto::NodeGroupDeleteNodesResponse>, Status> {
        // What is left of CA's deadline, not a fixed bound: the answer is back in time
        // whatever CA's grpc_timeout is.
        let bound = super::deadline::answer_within(sent(&req), self.provider.delete_nodes_bound());
        let r = req.into_inner();
        require_id(&r.id)?;
        let nodes: Vec<NodeRef> = r.nodes.iter().map(node_ref).collect();
        self.provider
            .delete_nodes_within(&r.id, &nodes, bound)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::NodeGroupDeleteNodesResponse {}))
    }

    async fn node_group_decrease_target_size(
        &self,
        req: Request<proto::NodeGroupDecreaseTargetSizeRequest>,
    ) -> Result<Response<proto::NodeGroupDecreaseTargetSizeResponse>, Status> {
        let bound = answer_bound(&req);
        let r = req.into_inner();
        require_id(&r.id)?;
        self.provider
            .decrease_target_size_within(&r.id, r.delta, bound)
            .await
            .map_err(status)?;
        Ok(Response::new(proto::NodeGroupDecreaseTargetSizeResponse {}))
    }

    async fn node_group_nodes(
        &self,
        req: Request<proto::NodeGroupNodesRequest>,
    ) -> Result<Response<proto::NodeGroupNodesResponse>, Status> {
        let id = req.into_inner().id;
        require_id(&id)?;
        let list = self.provider.nodes(&id).map_err(status)?;
        let instances = list
            .into_iter()
            .map(|i| proto::Instance {
                id: i.id,
                status: Some(proto::InstanceStatus {
                    instance_state: match i.state {
                        instances::InstanceState::Running => PbState::InstanceRunning,
                        instances::InstanceState::Creating => PbState::InstanceCreating,
                        instances::InstanceState::Deleting => PbState::InstanceDeleting,
                    } as i32,
                    error_info: i.error.map(|e| proto::InstanceErrorInfo {
                        error_code: e.code,
                        error_message: e.message,
                        instance_error_class: e.class as i32,
                    }),
                }),
            })
            .collect();
        Ok(Response::new(proto::NodeGroupNodesResponse { instances }))
    }

    async fn node_group_template_node_info(
        &self,
        req: Request<proto::NodeGroupTemplateNodeInfoRequest>,
    ) -> Result<Response<proto::NodeGroupTemplateNodeInfoResponse>, Status> {
        let bound = answer_bound(&req);
        let id = req.into_inner().id;
        require_id(&id)?;
        let node = self
            .provider
            .template_node_within(&id, bound)
            .await
            .map_err(status)?;
        if node.is_empty() {
            // An empty answer can crash CA; say we cannot instead.
            return Err(Status::unimplemented(format!(
                "node group {id}: no template node"
            )));
        }
        Ok(Response::new(proto::NodeGroupTemplateNodeInfoResponse {
            node_info: node.clone(),
            node_bytes: node,
        }))
    }

    async fn node_group_get_options(
        &self,
        req: Request<proto::NodeGroupAutoscalingOptionsRequest>,
    ) -> Result<Response<proto::NodeGroupAutoscalingOptionsResponse>, Status> {
        let r = req.into_inner();
        require_id(&r.id)?;
        let mut defaults = r.defaults.as_ref().map(from_proto).unwrap_or_default();
        fill_defaults(&mut defaults);
        let lacks = r
            .defaults
            .as_ref()
            .is_some_and(super::options::lacks_startup_time);
        let opts = self
            .provider
            .options(&r.id, &defaults, lacks)
            .map_err(status)?;
        Ok(Response::new(proto::NodeGroupAutoscalingOptionsResponse {
            node_group_autoscaling_options: Some(to_proto(&opts)),
        }))
    }
}

/// The deadline the client sent with a call (`grpc-timeout`), if any, readable.
fn sent<T>(req: &Request<T>) -> Option<Duration> {
    req.metadata()
        .get(super::deadline::HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(super::deadline::parse)
}

/// How long a call that may wait on AWS works: what is left of the deadline the client sent;
/// unbounded without one (a client that sets none waits as long as it takes).
fn answer_bound<T>(req: &Request<T>) -> Option<Duration> {
    sent(req).map(super::deadline::share)
}
