//! The provider core: node-group registry, providerID index, target sizes, template
//! nodes and autoscaling options. No AWS SDK, no Kubernetes client, no tonic.

pub mod options;
pub mod template;
