//! `templates:`: what a group's node looks like before it has one (scale from zero).

use std::collections::{BTreeMap, HashMap};

use super::Problems;
use crate::provider::template::TemplateOverrides;

/// Each template as written, its taints, max pods and VM memory overhead checked.
pub fn resolve(
    templates: &BTreeMap<String, TemplateOverrides>,
    problems: &mut Problems,
) -> HashMap<String, TemplateOverrides> {
    let mut out = HashMap::new();
    for (name, t) in templates {
        for (j, taint) in t.taints.iter().enumerate() {
            if let Err(m) = parse_taint(taint) {
                problems.bad(&format!("templates.{name}.taints[{j}]"), m);
            }
        }
        if let Some(p) = t.max_pods.filter(|p| *p <= 0 || *p > 1000) {
            problems.bad(
                &format!("templates.{name}.maxPods"),
                format!("{p} must be between 1 and 1000"),
            );
        }
        if let Some(p) = t.vm_memory_overhead_percent {
            if let Err(m) = check_vm_memory_overhead_percent(p) {
                problems.bad(&format!("templates.{name}.vmMemoryOverheadPercent"), m);
            }
        }
        out.insert(name.clone(), t.clone());
    }
    out
}

/// A VM memory overhead percent: a number from 0 to 50 (7.5 means 7.5 %).
pub fn check_vm_memory_overhead_percent(p: f64) -> Result<(), String> {
    let max = crate::provider::template::allocatable::MAX_VM_MEMORY_OVERHEAD_PERCENT;
    if p.is_finite() && (0.0..=max).contains(&p) {
        Ok(())
    } else {
        Err(format!(
            "{p} must be a percent between 0 and {max} (7.5 means 7.5 %; Karpenter's fraction 0.075 is 7.5 here)"
        ))
    }
}

/// `key=value:Effect` or `key:Effect` (validation only; the template builder parses).
pub fn parse_taint(s: &str) -> Result<(String, String, String), String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("{s:?} is not key=value:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "{s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
    if k.is_empty() {
        return Err(format!("{s:?}: the taint key is empty"));
    }
    Ok((k.to_string(), v.to_string(), effect.to_string()))
}
