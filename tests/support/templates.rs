//! A provider whose template clock the test turns.

use std::sync::Arc;

use ca_asg_provider::cloud::{Cloud, GroupSelector};
use ca_asg_provider::provider::templates::ManualClock;
use ca_asg_provider::provider::{Provider, ProviderSettings};

/// The provider over the groups `names` of `cloud`, its templates timed by a
/// [`ManualClock`], refreshed once and its templates prefetched.
pub async fn provider_on_manual_clock(
    cloud: Arc<dyn Cloud>,
    names: Vec<String>,
) -> (Arc<Provider>, ManualClock) {
    let p = Provider::new(
        cloud,
        ProviderSettings {
            selector: GroupSelector {
                names,
                tag_sets: vec![],
            },
            ..ProviderSettings::default()
        },
    );
    let clock = ManualClock::new();
    p.set_template_clock(Arc::new(clock.clone()));
    p.refresh_now().await.unwrap();
    p.templates_prefetched().await;
    (p, clock)
}

/// A template Node's taints as (key, value, effect), an absent field empty.
pub fn taint_triples(
    taints: Vec<k8s_pb::api::core::v1::Taint>,
) -> impl Iterator<Item = (String, String, String)> {
    taints.into_iter().map(|t| {
        (
            t.key.unwrap_or_default(),
            t.value.unwrap_or_default(),
            t.effect.unwrap_or_default(),
        )
    })
}
