//! Launch-template user data (whoever can write a launch template writes it): bootstrap.sh
//! flags, nodeadm NodeConfig (YAML, MIME multipart, base64 parts), Bottlerocket TOML and
//! plain kubelet flags. Parsing never panics and what it returns stays bounded and valid:
//! at most MAX_LABELS labels that kubelet would accept, MAX_TAINTS taints with a real
//! effect, max pods from 1 to 10000, and warnings of bounded length.
#![no_main]

use ca_asg_provider::provider::template::userdata::{self, MAX_LABELS, MAX_TAINTS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let f = userdata::parse(&text);
    assert!(f.labels.len() <= MAX_LABELS);
    assert!(f.taints.len() <= MAX_TAINTS);
    assert!(f.max_pods.is_none_or(|n| (1..=10_000).contains(&n)));
    assert!(f.pods_per_core.is_none_or(|n| (1..=10_000).contains(&n)));
    for (k, v) in &f.labels {
        assert!(userdata::check_label(k, v).is_ok(), "{k}={v}");
    }
    for t in &f.taints {
        assert!(matches!(
            t.effect.as_str(),
            "NoSchedule" | "PreferNoSchedule" | "NoExecute"
        ));
    }
    for w in &f.warnings {
        assert!(w.len() <= 1024, "{w}");
    }
});
