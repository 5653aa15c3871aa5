//! The memory cloud a load test runs against: N running nodes spread over G groups,
//! shaped like a real fleet (several instance types, three zones, tags CA discovers).

use super::{builtin_instance_types, MemoryGroup};

/// Parses `GROUPS:NODES` (the `--memory-cloud` flag).
pub fn parse_shape(s: &str) -> Result<(usize, usize), String> {
    let bad = || format!("--memory-cloud {s:?}: expected GROUPS:NODES, e.g. 200:5000");
    let (g, n) = s.split_once(':').ok_or_else(bad)?;
    let g: usize = g.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if g == 0 {
        return Err(format!("--memory-cloud {s:?}: GROUPS must be at least 1"));
    }
    if n > 1_000_000 {
        return Err(format!(
            "--memory-cloud {s:?}: NODES must be at most 1000000"
        ));
    }
    Ok((g, n))
}

/// `groups` ASGs named `ng-000`.., holding `nodes` instances between them (the first
/// `nodes % groups` groups get one more), instance types in turn, all tagged for
/// discovery with `k8s.io/cluster-autoscaler/enabled`.
pub fn fleet(groups: usize, nodes: usize) -> Vec<MemoryGroup> {
    let types: Vec<String> = builtin_instance_types()
        .into_values()
        .filter(|t| t.gpus == 0)
        .map(|t| t.name)
        .collect();
    let width = groups.saturating_sub(1).to_string().len().max(3);
    (0..groups)
        .map(|i| {
            let desired = (nodes / groups + usize::from(i < nodes % groups)) as i32;
            MemoryGroup::new(
                &format!("ng-{i:0width$}"),
                0,
                desired.max(1) * 2,
                desired,
                &types[i % types.len()],
            )
            .tag("k8s.io/cluster-autoscaler/enabled", "true")
            .tag(
                "k8s.io/cluster-autoscaler/node-template/label/pool",
                &format!("pool-{}", i % 7),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_name_the_flag() {
        assert_eq!(parse_shape("200:5000"), Ok((200, 5000)));
        assert!(parse_shape("200").unwrap_err().contains("GROUPS:NODES"));
        assert!(parse_shape("x:5").unwrap_err().contains("\"x:5\""));
        assert!(parse_shape("0:5").unwrap_err().contains("at least 1"));
    }

    #[test]
    fn nodes_are_spread_exactly_over_groups() {
        let f = fleet(7, 100);
        assert_eq!(f.len(), 7);
        assert_eq!(f.iter().map(|g| g.desired).sum::<i32>(), 100);
        assert!(f.iter().all(|g| g.desired == 14 || g.desired == 15));
        assert!(f.iter().all(|g| g.max_size >= g.desired));
        assert_eq!(f[0].name, "ng-000");
        let names: std::collections::BTreeSet<_> =
            fleet(1000, 0).into_iter().map(|g| g.name).collect();
        assert_eq!(names.len(), 1000);
    }
}
