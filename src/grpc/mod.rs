//! The externalgrpc CloudProvider service (tonic).

pub mod options;
