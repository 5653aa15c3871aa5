//! `scaleIn.budgets:`: disruption budgets, each read whole or refused whole (a
//! budget half read would hold too little). Every problem names the budget's place
//! in the list (`scaleIn.budgets[2].nodes`) and the value.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::{bounded_duration, Problems};
use crate::config::{BudgetFile, CountOrPercent};
use crate::scalein::decide::budget::{cron::Cron, Budget, Cause, Groups, Nodes, Rate, Window};

/// At most this many budgets (each drain start reads them all).
pub const MAX_BUDGETS: usize = 100;
/// At most this many groups, zones, tags or reasons in one budget.
const MAX_LIST: usize = 1000;
const MAX_NAME: usize = 63;

pub fn resolve(list: Option<&[BudgetFile]>, problems: &mut Problems) -> Vec<Budget> {
    let list = list.unwrap_or_default();
    if list.len() > MAX_BUDGETS {
        problems.bad(
            "scaleIn.budgets",
            format!("{} budgets (at most {MAX_BUDGETS})", list.len()),
        );
        return Vec::new();
    }
    let mut names = BTreeSet::new();
    let mut budgets = Vec::new();
    for (i, file) in list.iter().enumerate() {
        let key = format!("scaleIn.budgets[{i}]");
        let before = problems.count();
        let budget = one(&key, i, file, problems);
        if !names.insert(budget.name.clone()) {
            problems.bad(
                &format!("{key}.name"),
                format!(
                    "{:?} names two budgets; each name is said once",
                    budget.name
                ),
            );
        }
        if problems.count() == before {
            budgets.push(budget);
        }
    }
    budgets
}

/// One budget: its name, nodes, what it covers, its causes, window and rate.
fn one(key: &str, i: usize, f: &BudgetFile, problems: &mut Problems) -> Budget {
    Budget {
        name: name(key, i, f.name.as_deref(), problems),
        nodes: nodes(key, f.nodes.as_ref(), problems),
        groups: groups(key, f.groups.as_ref(), f.group_tags.as_ref(), problems),
        zones: list(&format!("{key}.zones"), f.zones.as_deref(), problems),
        causes: causes(key, f.reasons.as_deref(), problems),
        window: window(key, f, problems),
        rate: rate(key, f, problems),
    }
}

fn name(key: &str, i: usize, given: Option<&str>, problems: &mut Problems) -> String {
    let Some(n) = given else {
        return format!("budget-{i}");
    };
    let ok = !n.is_empty()
        && n.len() <= MAX_NAME
        && n.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !ok {
        let shown: String = n.chars().take(80).collect();
        problems.bad(
            &format!("{key}.name"),
            format!("{shown:?} must be 1 to {MAX_NAME} characters of a-z, 0-9 and '-' (it labels a metric)"),
        );
    }
    n.to_string()
}

fn nodes(key: &str, given: Option<&CountOrPercent>, problems: &mut Problems) -> Nodes {
    let text = match given {
        None => {
            problems.bad(
                &format!("{key}.nodes"),
                "missing: a count (3) or a percent (\"20%\") of the nodes the budget covers".into(),
            );
            return Nodes::Count(0);
        }
        Some(CountOrPercent::Count(n)) => n.to_string(),
        Some(CountOrPercent::Text(t)) => t.clone(),
    };
    Nodes::parse(&text).unwrap_or_else(|why| {
        problems.bad(&format!("{key}.nodes"), why);
        Nodes::Count(0)
    })
}

/// The groups of `key` (a budget or a group override): by name or by tags, not
/// both; neither: every group.
pub(super) fn groups(
    key: &str,
    names: Option<&Vec<String>>,
    tags: Option<&BTreeMap<String, String>>,
    problems: &mut Problems,
) -> Groups {
    match (names, tags) {
        (Some(_), Some(_)) => {
            problems.bad(
                &format!("{key}.groupTags"),
                "given with groups: select groups by name or by tags, not both".into(),
            );
            Groups::All
        }
        (Some(names), None) if names.is_empty() => {
            problems.bad(
                &format!("{key}.groups"),
                "an empty list covers no group; leave it out to cover every group".into(),
            );
            Groups::All
        }
        (Some(names), None) => Groups::Named(list(&format!("{key}.groups"), Some(names), problems)),
        (None, Some(tags)) if tags.is_empty() || tags.len() > MAX_LIST => {
            problems.bad(
                &format!("{key}.groupTags"),
                format!(
                    "{} tags: give 1 to {MAX_LIST}, or leave it out to cover every group",
                    tags.len()
                ),
            );
            Groups::All
        }
        (None, Some(tags)) => Groups::Tagged(
            tags.iter()
                .map(|(k, v)| (k.clone(), (!v.is_empty()).then(|| v.clone())))
                .collect::<BTreeMap<_, _>>(),
        ),
        (None, None) => Groups::All,
    }
}

fn list(key: &str, given: Option<&[String]>, problems: &mut Problems) -> BTreeSet<String> {
    let given = given.unwrap_or_default();
    if given.len() > MAX_LIST {
        problems.bad(key, format!("{} entries (at most {MAX_LIST})", given.len()));
        return BTreeSet::new();
    }
    if let Some(blank) = given.iter().find(|s| s.trim().is_empty() || s.len() > 255) {
        let shown: String = blank.chars().take(80).collect();
        problems.bad(key, format!("{shown:?} is not a name"));
    }
    given.iter().cloned().collect()
}

fn causes(key: &str, given: Option<&[String]>, problems: &mut Problems) -> Option<BTreeSet<Cause>> {
    let given = given?;
    let key = format!("{key}.reasons");
    if given.is_empty() || given.len() > MAX_LIST {
        problems.bad(
            &key,
            "an empty list governs nothing; leave it out to govern every cause".into(),
        );
        return None;
    }
    let mut set = BTreeSet::new();
    for name in given {
        match Cause::parse(name) {
            Ok(causes) => set.extend(causes.iter().copied()),
            Err(why) => problems.bad(&key, why),
        }
    }
    Some(set)
}

fn window(key: &str, f: &BudgetFile, problems: &mut Problems) -> Option<Window> {
    match (&f.schedule, &f.duration) {
        (None, None) => None,
        (Some(_), None) | (None, Some(_)) => {
            problems.bad(
                &format!(
                    "{key}.{}",
                    if f.schedule.is_some() {
                        "duration"
                    } else {
                        "schedule"
                    }
                ),
                "a window needs both schedule (cron, UTC) and duration".into(),
            );
            None
        }
        (Some(text), Some(_)) => {
            let duration = bounded_duration(
                problems,
                &format!("{key}.duration"),
                f.duration.as_ref(),
                Duration::from_secs(60),
                Duration::from_secs(60),
                Some(Duration::from_secs(366 * 86_400)),
            );
            match Cron::parse(text) {
                Ok(schedule) => Some(Window { schedule, duration }),
                Err(why) => {
                    problems.bad(&format!("{key}.schedule"), why);
                    None
                }
            }
        }
    }
}

fn rate(key: &str, f: &BudgetFile, problems: &mut Problems) -> Option<Rate> {
    let r = f.rate.as_ref()?;
    let starts = match r.starts {
        Some(s) if (1..=100_000).contains(&s) => s,
        other => {
            let said = other.map_or("missing".to_string(), |s| s.to_string());
            problems.bad(
                &format!("{key}.rate.starts"),
                format!("{said}: must be 1 to 100000 (nodes: 0 stops every start)"),
            );
            1
        }
    };
    if r.per.is_none() {
        problems.bad(
            &format!("{key}.rate.per"),
            "missing: the period the starts are counted over (\"10m\")".into(),
        );
    }
    let per = bounded_duration(
        problems,
        &format!("{key}.rate.per"),
        r.per.as_ref(),
        Duration::from_secs(60),
        Duration::from_secs(1),
        Some(Duration::from_secs(7 * 86_400)),
    );
    Some(Rate { starts, per })
}

#[cfg(test)]
pub(super) mod tests {
    use crate::config::{resolve, ConfigError, FileConfig, Overrides};
    use crate::scalein::decide::budget::{Cause, Groups, Nodes};

    /// Every problem `yaml` resolves to, as `key: message` (none when it resolves).
    pub(in crate::config::sections) fn problems(yaml: &str) -> Vec<String> {
        let file = FileConfig::parse(yaml, "t.yaml").expect("parses");
        match resolve(file, &Overrides::default(), "t.yaml") {
            Ok(_) => Vec::new(),
            Err(ConfigError::Invalid { problems, .. }) => problems
                .into_iter()
                .map(|p| format!("{}: {}", p.key, p.message))
                .collect(),
            Err(e) => vec![e.to_string()],
        }
    }

    #[test]
    fn budgets_are_read_with_every_field() {
        let file = FileConfig::parse(
            r#"
aws: {region: eu-west-1}
scaleIn:
  maxConcurrentDrains: 20
  budgets:
    - name: refresh-two
      nodes: 2
      groups: [web-a, web-b]
      zones: [eu-west-1a]
      reasons: [asg-instance-refresh, ca]
      rate: {starts: 4, per: 10m}
    - nodes: "0%"
      groupTags: {team: web, tier: ""}
      schedule: "0 9 * * mon-fri"
      duration: 8h
"#,
            "t.yaml",
        )
        .unwrap();
        let c = resolve(file, &Overrides::default(), "t.yaml").unwrap();
        let b = &c.scale_in.budgets;
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].name, "refresh-two");
        assert_eq!(b[0].nodes, Nodes::Count(2));
        assert_eq!(
            b[0].causes
                .as_ref()
                .unwrap()
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            vec![Cause::CaEmpty, Cause::CaOccupied, Cause::AsgInstanceRefresh]
        );
        assert_eq!(b[0].rate.unwrap().per, std::time::Duration::from_secs(600));
        assert_eq!(b[1].name, "budget-1");
        assert_eq!(b[1].nodes, Nodes::Percent(0));
        assert!(
            matches!(&b[1].groups, Groups::Tagged(t) if t["tier"].is_none() && t["team"].as_deref() == Some("web"))
        );
        assert_eq!(b[1].window.as_ref().unwrap().duration.as_secs(), 8 * 3600);
        let all = c.scale_in.budgets_in_order();
        assert_eq!(all.last().unwrap().name, "maxConcurrentDrains");
        assert_eq!(all.last().unwrap().nodes, Nodes::Count(20));
    }

    #[test]
    fn a_wrong_budget_is_refused_naming_its_place_field_and_value() {
        let got = problems(
            r#"
aws: {region: eu-west-1}
scaleIn:
  budgets:
    - {name: Bad_Name, nodes: "150%"}
    - {nodes: 1, groups: [a], groupTags: {t: x}}
    - {nodes: 1, reasons: [spot-interruption, consolidation]}
    - {nodes: 1, schedule: "0 25 * * *", duration: 1h}
    - {nodes: 1, schedule: "@daily"}
    - {nodes: 1, rate: {starts: 0}}
    - {name: twice, nodes: 1}
    - {name: twice, nodes: 2}
    - {groups: []}
"#,
        );
        let want = [
            "scaleIn.budgets[0].name: \"Bad_Name\"",
            "scaleIn.budgets[0].nodes: \"150%\" is not a percent",
            "scaleIn.budgets[1].groupTags: given with groups",
            "scaleIn.budgets[2].reasons: \"spot-interruption\" is never budgeted",
            "scaleIn.budgets[2].reasons: \"consolidation\" is not a cause",
            "scaleIn.budgets[3].schedule: hour field \"25\"",
            "scaleIn.budgets[4].duration: a window needs both",
            "scaleIn.budgets[5].rate.starts: 0: must be 1 to 100000",
            "scaleIn.budgets[5].rate.per: missing",
            "scaleIn.budgets[7].name: \"twice\" names two budgets",
            "scaleIn.budgets[8].nodes: missing",
            "scaleIn.budgets[8].groups: an empty list",
        ];
        for w in want {
            assert!(
                got.iter().any(|p| p.starts_with(w)),
                "{w}\nnot in\n{got:#?}"
            );
        }
        assert_eq!(got.len(), want.len(), "{got:#?}");
    }
}
