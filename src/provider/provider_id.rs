//! providerID parsing. Kubelet's AWS provider writes `aws:///<zone>/<instance-id>`;
//! CA's not-yet-registered nodes carry a bare instance id.

/// Prefix of placeholder instance ids, as CA's AWS provider names them.
pub const PLACEHOLDER_PREFIX: &str = "i-placeholder-";
/// Longest placeholder id `instances::placeholder_id` makes for a legal ASG name (255
/// characters of up to 4 UTF-8 bytes, each written as 3): provider ids are bounded
/// by it.
pub const PLACEHOLDER_ID_MAX: usize = PLACEHOLDER_PREFIX.len() + 255 * 4 * 3 + 1 + 20;

/// The instance id in a providerID, or `None` when it is not an AWS instance.
///
/// Accepts `aws:///us-east-1a/i-0abc`, `aws://us-east-1a/i-0abc` (seen on old kubelets)
/// and a bare `i-0abc`. Placeholder ids (`i-placeholder-...`) are accepted too, so CA
/// can delete them.
pub fn instance_id(provider_id: &str) -> Option<&str> {
    let id = match provider_id.strip_prefix("aws://") {
        Some(rest) => rest.rsplit('/').next()?,
        None if provider_id.contains('/') || provider_id.contains(':') => return None,
        None => provider_id,
    };
    is_instance_id(id).then_some(id)
}

/// `i-` followed by lowercase hex/alphanumerics and dashes (placeholders), bounded.
fn is_instance_id(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("i-") else {
        return false;
    };
    // Placeholder ids carry an encoded ASG name of up to 255 characters.
    let within = if s.starts_with(PLACEHOLDER_PREFIX) {
        s.len() <= PLACEHOLDER_ID_MAX
    } else {
        rest.len() <= 200
    };
    !rest.is_empty()
        && within
        && rest.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || b == b'-'
                || b == b'_'
                || b.is_ascii_uppercase()
                || b == b'.'
        })
}

/// The providerID of an instance in a zone.
pub fn for_instance(zone: &str, instance_id: &str) -> String {
    format!("aws:///{zone}/{instance_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_kubelet_form() {
        assert_eq!(
            instance_id("aws:///us-east-1a/i-0123456789abcdef0"),
            Some("i-0123456789abcdef0")
        );
    }

    #[test]
    fn parses_the_two_slash_form_and_bare_ids() {
        assert_eq!(instance_id("aws://us-east-1a/i-0abc"), Some("i-0abc"));
        assert_eq!(instance_id("i-0abc"), Some("i-0abc"));
        assert_eq!(
            instance_id("i-placeholder-my-asg-3"),
            Some("i-placeholder-my-asg-3")
        );
    }

    #[test]
    fn rejects_other_clouds_and_garbage() {
        for bad in [
            "",
            "aws:///",
            "aws:///us-east-1a/",
            "aws:///us-east-1a/vol-123",
            "gce://project/zone/name",
            "azure:///subscriptions/x",
            "kind://docker/kind/node",
            "i-",
            "node-1",
            "i-abc/def",
            "aws:///us-east-1a/i-ab c",
        ] {
            assert_eq!(instance_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn round_trips() {
        let p = for_instance("eu-west-1b", "i-0f");
        assert_eq!(instance_id(&p), Some("i-0f"));
    }
}
