//! Label and field selectors as the API server parses them. Pure.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for term in split_top(s) {
            let t = term.trim();
            let bad = || format!("labelSelector {s:?}: cannot parse {t:?}");
            let set = |rest: &str| -> Result<Vec<String>, String> {
                let inner = rest
                    .trim()
                    .strip_prefix('(')
                    .and_then(|r| r.strip_suffix(')'))
                    .ok_or_else(bad)?;
                Ok(inner
                    .split(',')
                    .map(|v| v.trim().to_string())
                    .filter(|v| !v.is_empty())
                    .collect())
            };
            let req = if let Some(k) = t.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = t.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = t.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, rest)) = t.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set(rest)?)
            } else if let Some((k, rest)) = t.split_once(" in ") {
                LabelReq::In(k.trim().into(), set(rest)?)
            } else {
                LabelReq::Exists(t.to_string())
            };
            let key = match &req {
                LabelReq::Eq(k, _)
                | LabelReq::NotEq(k, _)
                | LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => labels.get(k) == Some(v),
            LabelReq::NotEq(k, v) => labels.get(k) != Some(v),
            LabelReq::In(k, vs) => labels.get(k).is_some_and(|x| vs.contains(x)),
            LabelReq::NotIn(k, vs) => labels.get(k).is_none_or(|x| !vs.contains(x)),
            LabelReq::Exists(k) => labels.contains_key(k),
            LabelReq::NotExists(k) => !labels.contains_key(k),
        })
    }

    /// [`Self::matches`] on an object; an empty selector (most watches) reads nothing.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.0.is_empty() || self.matches(&labels_of(obj))
    }
}

/// A parsed `fieldSelector` (`a.b=c`, `a.b==c`, `a.b!=c`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            let (path, eq, val) = if let Some((p, v)) = t.split_once("!=") {
                (p, false, v)
            } else if let Some((p, v)) = t.split_once("==") {
                (p, true, v)
            } else if let Some((p, v)) = t.split_once('=') {
                (p, true, v)
            } else {
                return Err(format!("fieldSelector {s:?}: {t:?} is not field=value"));
            };
            let path = path.trim();
            if !matches!(
                path,
                "spec.nodeName"
                    | "metadata.name"
                    | "metadata.namespace"
                    | "status.phase"
                    | "spec.schedulerName"
                    | "involvedObject.name"
                    | "regarding.name"
            ) {
                return Err(format!(
                    "fieldSelector {s:?}: field {path:?} is not supported"
                ));
            }
            out.push((path.to_string(), eq, val.trim().to_string()));
        }
        Ok(Self(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, val)| {
            let mut cur = obj;
            for part in path.split('.') {
                cur = &cur[part];
            }
            let have = cur.as_str().unwrap_or("");
            (have == val) == *eq
        })
    }
}

/// Labels of an object.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Does a LabelSelector object (`matchLabels` / `matchExpressions`) select these labels?
/// An empty selector selects everything, as in policy/v1.
pub fn selector_object_matches(sel: &Value, labels: &BTreeMap<String, String>) -> bool {
    selects(sel, |k| labels.get(k).map(String::as_str))
}

/// [`selector_object_matches`] on an object's own labels, read in place: a budget is
/// checked against every pod of its namespace, and copying each pod's labels into a
/// map first cost more than the check.
pub fn selector_selects_object(sel: &Value, obj: &Value) -> bool {
    let labels = &obj["metadata"]["labels"];
    selects(sel, |k| labels.get(k).and_then(Value::as_str))
}

fn selects<'a>(sel: &Value, label: impl Fn(&str) -> Option<&'a str>) -> bool {
    if let Some(ml) = sel["matchLabels"].as_object() {
        if !ml.iter().all(|(k, v)| label(k) == v.as_str()) {
            return false;
        }
    }
    if let Some(exprs) = sel["matchExpressions"].as_array() {
        for e in exprs {
            let key = e["key"].as_str().unwrap_or("");
            let values: Vec<&str> = e["values"]
                .as_array()
                .map(|a| a.iter().filter_map(|v| v.as_str()).collect())
                .unwrap_or_default();
            let ok = match e["operator"].as_str().unwrap_or("") {
                "In" => label(key).is_some_and(|v| values.contains(&v)),
                "NotIn" => label(key).is_none_or(|v| !values.contains(&v)),
                "Exists" => label(key).is_some(),
                "DoesNotExist" => label(key).is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(p: &[(&str, &str)]) -> BTreeMap<String, String> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors() {
        let s =
            LabelSelector::parse("app=web,tier!=db,env in (prod, staging),!legacy,zone").unwrap();
        assert!(s.matches(&l(&[("app", "web"), ("env", "prod"), ("zone", "a")])));
        assert!(!s.matches(&l(&[("app", "web"), ("env", "dev"), ("zone", "a")])));
        assert!(!s.matches(&l(&[
            ("app", "web"),
            ("env", "prod"),
            ("zone", "a"),
            ("legacy", "1")
        ])));
        assert!(!s.matches(&l(&[("app", "web"), ("env", "prod")])));
        let s = LabelSelector::parse("x notin (a,b)").unwrap();
        assert!(
            s.matches(&l(&[])) && s.matches(&l(&[("x", "c")])) && !s.matches(&l(&[("x", "a")]))
        );
        assert!(LabelSelector::parse("").unwrap().matches(&l(&[])));
        let e = LabelSelector::parse("a in b").unwrap_err();
        assert!(e.contains("a in b"), "{e}");
        assert!(LabelSelector::parse("a b c").is_err());
    }

    #[test]
    fn field_selectors() {
        let pod = serde_json::json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("spec.nodeName=n1")
            .unwrap()
            .matches(&pod));
        assert!(!FieldSelector::parse("spec.nodeName=n2")
            .unwrap()
            .matches(&pod));
        assert!(
            FieldSelector::parse("status.phase!=Succeeded,metadata.namespace==ns")
                .unwrap()
                .matches(&pod)
        );
        let e = FieldSelector::parse("spec.foo=1").unwrap_err();
        assert!(e.contains("spec.foo"));
        assert!(FieldSelector::parse("nonsense").is_err());
    }

    #[test]
    fn selector_objects() {
        let sel = serde_json::json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["fe"]}]});
        assert!(selector_object_matches(
            &sel,
            &l(&[("app", "web"), ("tier", "fe")])
        ));
        assert!(!selector_object_matches(&sel, &l(&[("app", "web")])));
        assert!(selector_object_matches(&serde_json::json!({}), &l(&[])));
    }
}
