//! `nodeGroups` and `autoDiscovery` (and CA's `--nodes`, `--node-group-auto-discovery`):
//! which groups are ours.

use std::collections::HashMap;

use super::Problems;
use crate::cloud::{GroupSelector, TagFilter};
use crate::config::{FileConfig, Overrides, StaticGroup};
use crate::provider::Bounds;

/// The resolved selection: the groups by name and by tags, and the bounds of those
/// named.
pub struct Groups {
    pub selector: GroupSelector,
    pub static_bounds: HashMap<String, Bounds>,
}

/// The groups named in the file, then in `--nodes`; then the tag sets of the file,
/// then of `--node-group-auto-discovery`.
pub fn resolve(file: &FileConfig, flags: &Overrides, problems: &mut Problems) -> Groups {
    let mut selector = GroupSelector::default();
    let static_bounds = named(file, flags, &mut selector, problems);
    discovered(file, flags, &mut selector, problems);
    Groups {
        selector,
        static_bounds,
    }
}

/// Each named group once, with a non-empty name and sizes that are not negative nor
/// upside down.
fn named(
    file: &FileConfig,
    flags: &Overrides,
    selector: &mut GroupSelector,
    problems: &mut Problems,
) -> HashMap<String, Bounds> {
    let mut static_bounds = HashMap::new();
    let mut groups: Vec<(String, StaticGroup)> = file
        .node_groups
        .iter()
        .enumerate()
        .map(|(i, g)| (format!("nodeGroups[{i}]"), g.clone()))
        .collect();
    for (i, spec) in flags.nodes.iter().enumerate() {
        match parse_nodes_flag(spec) {
            Ok(g) => groups.push((format!("--nodes[{i}]"), g)),
            Err(m) => problems.bad(&format!("--nodes[{i}]"), m),
        }
    }
    for (key, g) in &groups {
        if g.name.trim().is_empty() {
            problems.bad(&format!("{key}.name"), "must not be empty".into());
            continue;
        }
        if let (Some(min), Some(max)) = (g.min_size, g.max_size) {
            if min > max {
                problems.bad(
                    key,
                    format!(
                        "minSize {min} is greater than maxSize {max} for group {}",
                        g.name
                    ),
                );
            }
        }
        for (field, v) in [("minSize", g.min_size), ("maxSize", g.max_size)] {
            if let Some(v) = v.filter(|v| *v < 0) {
                problems.bad(
                    &format!("{key}.{field}"),
                    format!("{v} must not be negative"),
                );
            }
        }
        if static_bounds
            .insert(
                g.name.clone(),
                Bounds {
                    min: g.min_size,
                    max: g.max_size,
                },
            )
            .is_some()
        {
            problems.bad(key, format!("group {} is listed twice", g.name));
        } else {
            selector.names.push(g.name.clone());
        }
    }
    static_bounds
}

/// Each tag set well formed.
fn discovered(
    file: &FileConfig,
    flags: &Overrides,
    selector: &mut GroupSelector,
    problems: &mut Problems,
) {
    for (i, d) in file.auto_discovery.iter().enumerate() {
        let key = format!("autoDiscovery[{i}].tags");
        match parse_tag_terms(&d.tags.join(",")) {
            Ok(set) => selector.tag_sets.push(set),
            Err(m) => problems.bad(&key, m),
        }
    }
    for (i, spec) in flags.auto_discovery.iter().enumerate() {
        match parse_discovery_flag(spec) {
            Ok(set) => selector.tag_sets.push(set),
            Err(m) => problems.bad(&format!("--node-group-auto-discovery[{i}]"), m),
        }
    }
}

/// CA's `--nodes=<min>:<max>:<name>`.
pub fn parse_nodes_flag(spec: &str) -> Result<StaticGroup, String> {
    let parts: Vec<&str> = spec.splitn(3, ':').collect();
    if parts.len() != 3 {
        return Err(format!("{spec:?} is not min:max:name"));
    }
    let num = |what: &str, s: &str| {
        s.trim()
            .parse::<i32>()
            .map_err(|_| format!("{spec:?}: {what} {s:?} is not a whole number"))
    };
    let min = num("min", parts[0])?;
    let max = num("max", parts[1])?;
    let name = parts[2].trim();
    if name.is_empty() {
        return Err(format!("{spec:?}: the group name is empty"));
    }
    Ok(StaticGroup {
        name: name.to_string(),
        min_size: Some(min),
        max_size: Some(max),
    })
}

/// CA's `--node-group-auto-discovery=asg:tag=<key>[=<value>],<key2>...`.
pub fn parse_discovery_flag(spec: &str) -> Result<Vec<TagFilter>, String> {
    let rest = spec
        .strip_prefix("asg:")
        .ok_or_else(|| format!("{spec:?}: only the asg: discoverer is supported (asg:tag=...)"))?;
    let terms = rest
        .strip_prefix("tag=")
        .ok_or_else(|| format!("{spec:?}: expected asg:tag=<key>[=<value>],..."))?;
    parse_tag_terms(terms).map_err(|m| format!("{spec:?}: {m}"))
}

/// `key` or `key=value` terms, comma-separated.
pub fn parse_tag_terms(terms: &str) -> Result<Vec<TagFilter>, String> {
    let mut out = Vec::new();
    for term in terms.split(',') {
        let term = term.trim();
        if term.is_empty() {
            return Err(format!("empty tag term in {terms:?}"));
        }
        let (key, value) = match term.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim().to_string())),
            None => (term, None),
        };
        if key.is_empty() {
            return Err(format!("tag term {term:?} has an empty key"));
        }
        out.push(TagFilter {
            key: key.to_string(),
            value,
        });
    }
    Ok(out)
}
