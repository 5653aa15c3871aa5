//! `aws:` (and `--region`, `--aws-endpoint`): where and how AWS is reached.

use super::Problems;
use crate::config::{AwsConfig, Overrides};

/// The resolved `aws:` section.
pub struct Aws {
    /// Empty: not given here (see [`resolve`]).
    pub region: String,
    pub endpoint: Option<String>,
    pub max_attempts: u32,
}

/// The region from the flag, the file or the environment; the endpoint from the flag
/// or the file, an http(s) URL; 1 to 20 SDK attempts.
pub fn resolve(aws: &AwsConfig, flags: &Overrides, problems: &mut Problems) -> Aws {
    let region = flags
        .region
        .clone()
        .or(aws.region.clone())
        .or_else(|| std::env::var("AWS_REGION").ok())
        .or_else(|| std::env::var("AWS_DEFAULT_REGION").ok())
        .filter(|r| !r.trim().is_empty())
        // Empty: not given here; the AWS SDK's chain (profile, instance metadata) is
        // asked when AWS is reached, and the commands refuse to start without one
        // (cloud::aws::resolve_region). Never guessed.
        .unwrap_or_default();
    let endpoint = flags.aws_endpoint.clone().or(aws.endpoint.clone());
    if let Some(e) = &endpoint {
        if !(e.starts_with("http://") || e.starts_with("https://")) {
            problems.bad(
                "aws.endpoint",
                format!("{e:?} must start with http:// or https://"),
            );
        }
    }
    let max_attempts = aws.max_attempts.unwrap_or(3);
    if max_attempts == 0 || max_attempts > 20 {
        problems.bad(
            "aws.maxAttempts",
            format!("{max_attempts} must be between 1 and 20"),
        );
    }
    Aws {
        region,
        endpoint,
        max_attempts,
    }
}
