//! The gRPC codec of the generated client and server: prost's, except that a
//! NodeGroupForNode request is read without the Node's labels and annotations.
//!
//! CA sends NodeGroupForNode twice per node per loop (10,000 calls a loop at 5,000
//! nodes), each Node with a dozen labels. The server reads only the providerID and the
//! name (`grpc::service::node_ref`); decoding the two maps cost ~30 allocations and a
//! UTF-8 check per string per call, the largest share of the CPU the server spent
//! above the transport floor (`loadgen --floor`). The skipped fields are still
//! checked for well-formed framing; every other message decodes as prost generates it.

use std::any::{Any, TypeId};
use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::ProstEncoder;

use super::{ExternalGrpcNode, NodeGroupForNodeRequest};

/// prost's codec with the lean NodeGroupForNode decoding (see the module doc).
#[derive(Debug, Clone)]
pub struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = LeanDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        LeanDecoder(PhantomData)
    }
}

#[derive(Debug, Clone)]
pub struct LeanDecoder<U>(PhantomData<U>);

/// ExternalGrpcNode as the server reads it: fields 3 and 4 (labels, annotations)
/// are skipped as unknown fields, without allocating.
#[derive(Clone, PartialEq, Message)]
struct NodeIdentity {
    #[prost(string, tag = "1")]
    provider_id: String,
    #[prost(string, tag = "2")]
    name: String,
}

#[derive(Clone, PartialEq, Message)]
struct ForNodeIdentity {
    #[prost(message, optional, tag = "1")]
    node: Option<NodeIdentity>,
}

/// A NodeGroupForNode request with only what the server reads.
pub fn decode_for_node(
    buf: impl bytes::Buf,
) -> Result<NodeGroupForNodeRequest, prost::DecodeError> {
    let lean = ForNodeIdentity::decode(buf)?;
    Ok(NodeGroupForNodeRequest {
        node: lean.node.map(|n| ExternalGrpcNode {
            provider_id: n.provider_id,
            name: n.name,
            ..ExternalGrpcNode::default()
        }),
    })
}

fn internal(e: prost::DecodeError) -> Status {
    // As prost's codec: a message that does not parse is INTERNAL.
    Status::internal(e.to_string())
}

impl<U: Message + Default + 'static> Decoder for LeanDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        if TypeId::of::<U>() == TypeId::of::<NodeGroupForNodeRequest>() {
            let request: Box<dyn Any> = Box::new(decode_for_node(buf).map_err(internal)?);
            return match request.downcast::<U>() {
                Ok(u) => Ok(Some(*u)),
                Err(_) => Err(Status::internal("NodeGroupForNode request type mismatch")),
            };
        }
        U::decode(buf).map(Some).map_err(internal)
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node() -> ExternalGrpcNode {
        ExternalGrpcNode {
            provider_id: "aws:///us-east-1a/i-0abc".into(),
            name: "ip-10-0-0-1.ec2.internal".into(),
            labels: [
                ("kubernetes.io/os", "linux"),
                ("topology.kubernetes.io/zone", "us-east-1a"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            annotations: [("node.alpha.kubernetes.io/ttl".to_string(), "0".to_string())].into(),
        }
    }

    #[test]
    fn for_node_keeps_the_identity_and_drops_the_maps() {
        let sent = NodeGroupForNodeRequest { node: Some(node()) };
        let got = decode_for_node(&sent.encode_to_vec()[..]).unwrap();
        let n = got.node.unwrap();
        assert_eq!(n.provider_id, "aws:///us-east-1a/i-0abc");
        assert_eq!(n.name, "ip-10-0-0-1.ec2.internal");
        assert!(n.labels.is_empty() && n.annotations.is_empty());
        // A request without a node stays without one (the service answers
        // InvalidArgument naming the field).
        let empty = decode_for_node(&NodeGroupForNodeRequest { node: None }.encode_to_vec()[..]);
        assert_eq!(empty.unwrap().node, None);
    }

    #[test]
    fn broken_framing_in_a_skipped_field_is_still_an_error() {
        let mut bytes = NodeGroupForNodeRequest { node: Some(node()) }.encode_to_vec();
        // Cut the message inside the labels map.
        bytes.truncate(bytes.len() - 5);
        let e = decode_for_node(&bytes[..]).unwrap_err();
        assert!(!e.to_string().is_empty());
        assert!(
            NodeGroupForNodeRequest::decode(&bytes[..]).is_err(),
            "prost agrees"
        );
    }
}
