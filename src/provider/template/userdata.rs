//! Kubelet flags from launch-template user data: EKS `bootstrap.sh
//! --kubelet-extra-args`, nodeadm `NodeConfig` (plain or inside MIME multipart), and
//! Bottlerocket TOML. Pure; never fails, problems come back as warnings.

use std::collections::BTreeMap;

use base64::Engine as _;

use crate::cloud::Taint;

/// What the user data tells kubelet.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeletFlags {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub max_pods: Option<i64>,
    /// Bottlerocket settings (TOML): its kubelet data lives on the second volume.
    pub bottlerocket: bool,
    /// The user data is for Windows (see [`is_windows_user_data`]).
    pub windows: bool,
    pub warnings: Vec<String>,
}

/// Parses user data of any supported shape.
pub fn parse(user_data: &str) -> KubeletFlags {
    let mut out = KubeletFlags {
        windows: is_windows_user_data(user_data),
        ..KubeletFlags::default()
    };
    for part in mime_parts(user_data) {
        parse_part(&part, &mut out);
    }
    out
}

fn parse_part(text: &str, out: &mut KubeletFlags) {
    if text.contains("kind: NodeConfig") || text.contains("\"kind\": \"NodeConfig\"") {
        parse_nodeadm(text, out);
    } else if let Some(settings) = bottlerocket_settings(text, out) {
        out.bottlerocket = true;
        apply_bottlerocket(&settings, out);
    } else {
        for flag in shell_kubelet_flags(text) {
            apply_flag(&flag, out);
        }
    }
}

/// Whether user data is written for a Windows instance: an EC2Launch/EC2Config
/// `<powershell>` block, the EKS Windows AMI's `Start-EKSBootstrap.ps1`, or an
/// EC2Launch v2 YAML document (`task: executeScript`). Linux cloud-init, shell,
/// nodeadm and Bottlerocket user data contain none of these. Case-insensitive, as
/// EC2Launch reads its tags.
pub fn is_windows_user_data(user_data: &str) -> bool {
    let lower = user_data.to_ascii_lowercase();
    lower.contains("<powershell>")
        || lower.contains("start-eksbootstrap.ps1")
        || lower
            .lines()
            .any(|l| l.trim_start_matches([' ', '\t', '-']).trim_end() == "task: executescript")
}

/// The parts of a MIME multipart document (decoded), or the whole text when it is
/// not multipart.
fn mime_parts(text: &str) -> Vec<String> {
    let boundary = text.lines().take(20).find_map(|l| {
        let lower = l.to_ascii_lowercase();
        if !lower.starts_with("content-type:") || !lower.contains("multipart/") {
            return None;
        }
        let idx = lower.find("boundary=")?;
        Some(
            l[idx + 9..]
                .trim()
                .trim_matches('"')
                .trim_end_matches(';')
                .to_string(),
        )
    });
    let Some(b) = boundary.filter(|b| !b.is_empty()) else {
        return vec![text.to_string()];
    };
    let sep = format!("--{b}");
    let mut parts = Vec::new();
    for raw in text.split(&sep).skip(1) {
        if raw.starts_with("--") {
            break;
        }
        let raw = raw.trim_start_matches(['\r', '\n']);
        let (headers, body) = match raw.find("\n\n").or_else(|| raw.find("\r\n\r\n")) {
            Some(i) => (&raw[..i], raw[i..].trim_start_matches(['\r', '\n'])),
            None => ("", raw),
        };
        let b64 = headers
            .to_ascii_lowercase()
            .contains("content-transfer-encoding: base64");
        if b64 {
            let compact: String = body.split_whitespace().collect();
            match base64::engine::general_purpose::STANDARD.decode(compact) {
                Ok(bytes) => parts.push(String::from_utf8_lossy(&bytes).into_owned()),
                Err(_) => continue,
            }
        } else {
            parts.push(body.to_string());
        }
    }
    parts
}

/// Kubelet flags in a shell script: the value of `--kubelet-extra-args` passed to
/// bootstrap.sh (quoted), plus `KUBELET_EXTRA_ARGS=...` exports.
fn shell_kubelet_flags(script: &str) -> Vec<String> {
    let joined = script.replace("\\\n", " ");
    let mut flags = Vec::new();
    // `-KubeletExtraArgs` is the EKS Windows bootstrap script's parameter.
    for marker in [
        "--kubelet-extra-args",
        "KUBELET_EXTRA_ARGS=",
        "-KubeletExtraArgs",
    ] {
        let mut rest = joined.as_str();
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            let value = rest.trim_start_matches(['=', ' ', '\t']);
            let (args, after) = take_shell_word(value);
            flags.extend(split_args(&args));
            rest = after;
        }
    }
    flags
}

/// One shell word: quoted ('...' or "...") or up to whitespace.
fn take_shell_word(s: &str) -> (String, &str) {
    let mut chars = s.char_indices();
    match chars.next() {
        Some((_, q @ ('\'' | '"'))) => match s[1..].find(q) {
            Some(end) => (s[1..1 + end].to_string(), &s[2 + end..]),
            None => (s[1..].to_string(), ""),
        },
        Some(_) => {
            let end = s.find(char::is_whitespace).unwrap_or(s.len());
            (s[..end].to_string(), &s[end..])
        }
        None => (String::new(), ""),
    }
}

/// Splits `--a=b --c d` into `--a=b`, `--c=d`.
fn split_args(args: &str) -> Vec<String> {
    let words: Vec<&str> = args.split_whitespace().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < words.len() {
        let w = words[i];
        if w.starts_with("--")
            && !w.contains('=')
            && i + 1 < words.len()
            && !words[i + 1].starts_with("--")
        {
            out.push(format!("{w}={}", words[i + 1]));
            i += 2;
        } else {
            out.push(w.to_string());
            i += 1;
        }
    }
    out
}

/// Applies one `--flag=value`.
fn apply_flag(flag: &str, out: &mut KubeletFlags) {
    let Some((name, value)) = flag.split_once('=') else {
        return;
    };
    let value = value.trim().trim_matches(['"', '\'']);
    match name.trim() {
        "--node-labels" => {
            for kv in value.split(',').filter(|s| !s.trim().is_empty()) {
                match kv.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() => {
                        out.labels
                            .insert(k.trim().to_string(), v.trim().to_string());
                    }
                    _ => out
                        .warnings
                        .push(format!("user data --node-labels: {kv:?} is not key=value")),
                }
            }
        }
        "--register-with-taints" => {
            for t in value.split(',').filter(|s| !s.trim().is_empty()) {
                match parse_taint(t.trim()) {
                    Ok(t) => out.taints.push(t),
                    Err(e) => out
                        .warnings
                        .push(format!("user data --register-with-taints: {e}")),
                }
            }
        }
        "--max-pods" => match value.parse::<i64>() {
            Ok(n) if n > 0 => out.max_pods = Some(n),
            _ => out.warnings.push(format!(
                "user data --max-pods: {value:?} is not a positive number"
            )),
        },
        _ => {}
    }
}

/// `key=value:Effect` or `key:Effect`.
pub fn parse_taint(s: &str) -> Result<Taint, String> {
    let (kv, effect) = s
        .rsplit_once(':')
        .ok_or_else(|| format!("taint {s:?} is not key=value:Effect"))?;
    if !matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
        return Err(format!(
            "taint {s:?}: effect {effect:?} is not NoSchedule, PreferNoSchedule or NoExecute"
        ));
    }
    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
    if k.is_empty() {
        return Err(format!("taint {s:?} has an empty key"));
    }
    Ok(Taint {
        key: k.to_string(),
        value: v.to_string(),
        effect: effect.to_string(),
    })
}

/// nodeadm NodeConfig: `spec.kubelet.flags` and `spec.kubelet.config.maxPods`.
fn parse_nodeadm(text: &str, out: &mut KubeletFlags) {
    let doc: serde_json::Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            out.warnings
                .push(format!("user data NodeConfig does not parse: {e}"));
            return;
        }
    };
    let kubelet = &doc["spec"]["kubelet"];
    if let Some(flags) = kubelet["flags"].as_array() {
        for f in flags.iter().filter_map(|f| f.as_str()) {
            for flag in split_args(f) {
                apply_flag(&flag, out);
            }
        }
    }
    if let Some(n) = kubelet["config"]["maxPods"].as_i64() {
        out.max_pods = Some(n);
    }
    if let Some(labels) = kubelet["config"]["nodeLabels"].as_object() {
        for (k, v) in labels {
            if let Some(v) = v.as_str() {
                out.labels.insert(k.clone(), v.to_string());
            }
        }
    }
}

/// Bottlerocket user data: TOML with a `settings.kubernetes` table, in any TOML
/// spelling (sections, dotted keys, inline tables). None when the text is not TOML
/// (a shell script is not) or has no such table; a text that looks like Bottlerocket
/// settings but does not parse is a warning.
fn bottlerocket_settings(text: &str, out: &mut KubeletFlags) -> Option<toml::Table> {
    match text.parse::<toml::Table>() {
        Ok(doc) => {
            let k8s = doc.get("settings")?.get("kubernetes")?.as_table()?;
            Some(k8s.clone())
        }
        Err(e) => {
            if text.contains("[settings") || text.contains("settings.kubernetes") {
                let why = e.to_string();
                out.warnings.push(format!(
                    "user data looks like Bottlerocket settings but is not valid TOML: {}",
                    why.lines().next().unwrap_or_default()
                ));
            }
            None
        }
    }
}

/// A TOML value as a warning names it.
fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => format!("a {}", other.type_str()),
    }
}

/// `node-labels`, `node-taints` (a value or a list of `value:Effect`) and `max-pods`
/// of `settings.kubernetes`.
fn apply_bottlerocket(k8s: &toml::Table, out: &mut KubeletFlags) {
    if let Some(labels) = k8s.get("node-labels").and_then(toml::Value::as_table) {
        for (k, v) in labels {
            match v.as_str() {
                Some(v) => {
                    out.labels.insert(k.clone(), v.to_string());
                }
                None => out.warnings.push(format!(
                    "user data node-labels.{k} = {}: not a string",
                    shown(v)
                )),
            }
        }
    }
    if let Some(taints) = k8s.get("node-taints").and_then(toml::Value::as_table) {
        for (k, v) in taints {
            let values: Vec<&toml::Value> = match v {
                toml::Value::Array(a) => a.iter().collect(),
                one => vec![one],
            };
            for val in values {
                let Some(val) = val.as_str() else {
                    out.warnings.push(format!(
                        "user data node-taints.{k} = {}: not a string",
                        shown(val)
                    ));
                    continue;
                };
                match parse_taint(&format!("{k}={val}")) {
                    Ok(t) => out.taints.push(t),
                    Err(e) => out.warnings.push(format!("user data node-taints: {e}")),
                }
            }
        }
    }
    if let Some(v) = k8s.get("max-pods") {
        match v.as_integer() {
            Some(n) => out.max_pods = Some(n),
            None => out
                .warnings
                .push(format!("user data max-pods = {}: not an integer", shown(v))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(k: &str, v: &str, e: &str) -> Taint {
        Taint {
            key: k.into(),
            value: v.into(),
            effect: e.into(),
        }
    }

    #[test]
    fn bootstrap_sh_single_quoted() {
        let f = parse("#!/bin/bash\nset -ex\n/etc/eks/bootstrap.sh my-cluster --kubelet-extra-args '--node-labels=team=ml,gpu=true --register-with-taints=dedicated=ml:NoSchedule --max-pods=20' --b64-cluster-ca abc\n");
        assert_eq!(f.labels.get("team").map(String::as_str), Some("ml"));
        assert_eq!(f.labels.get("gpu").map(String::as_str), Some("true"));
        assert_eq!(f.taints, vec![taint("dedicated", "ml", "NoSchedule")]);
        assert_eq!(f.max_pods, Some(20));
        assert!(f.warnings.is_empty());
    }

    #[test]
    fn bootstrap_sh_double_quoted_space_separated_and_continued() {
        let f = parse("/etc/eks/bootstrap.sh c \\\n  --kubelet-extra-args \"--node-labels a=b --register-with-taints k:NoExecute\"\n");
        assert_eq!(f.labels.get("a").map(String::as_str), Some("b"));
        assert_eq!(f.taints, vec![taint("k", "", "NoExecute")]);
    }

    #[test]
    fn kubelet_extra_args_export() {
        let f = parse("export KUBELET_EXTRA_ARGS='--node-labels=x=y'\n");
        assert_eq!(f.labels.get("x").map(String::as_str), Some("y"));
    }

    #[test]
    fn nodeadm_plain() {
        let f = parse(
            "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n    name: c\n  kubelet:\n    config:\n      maxPods: 58\n    flags:\n      - --node-labels=role=batch,tier=2\n      - --register-with-taints=batch=true:PreferNoSchedule\n",
        );
        assert_eq!(f.labels.get("role").map(String::as_str), Some("batch"));
        assert_eq!(f.labels.get("tier").map(String::as_str), Some("2"));
        assert_eq!(f.taints, vec![taint("batch", "true", "PreferNoSchedule")]);
        assert_eq!(f.max_pods, Some(58));
    }

    #[test]
    fn mime_multipart_with_nodeadm_and_base64_shell() {
        let shell = base64::engine::general_purpose::STANDARD.encode("#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=from=shell'\n");
        let doc = format!(
            "MIME-Version: 1.0\nContent-Type: multipart/mixed; boundary=\"BOUNDARY\"\n\n--BOUNDARY\nContent-Type: application/node.eks.aws\n\napiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  kubelet:\n    flags:\n      - --node-labels=from=nodeadm\n      - --register-with-taints=a=b:NoSchedule\n\n--BOUNDARY\nContent-Type: text/x-shellscript\nContent-Transfer-Encoding: base64\n\n{shell}\n--BOUNDARY--\n"
        );
        let f = parse(&doc);
        // The later part wins for the same key, as kubelet would see the last flag.
        assert_eq!(f.labels.get("from").map(String::as_str), Some("shell"));
        assert_eq!(f.taints, vec![taint("a", "b", "NoSchedule")]);
    }

    #[test]
    fn bottlerocket_toml() {
        let f = parse("[settings.kubernetes]\nmax-pods = 29\n[settings.kubernetes.node-labels]\n\"team\" = \"web\"\n[settings.kubernetes.node-taints]\n\"dedicated\" = [\"web:NoSchedule\"]\n");
        assert_eq!(f.labels.get("team").map(String::as_str), Some("web"));
        assert_eq!(f.taints, vec![taint("dedicated", "web", "NoSchedule")]);
        assert_eq!(f.max_pods, Some(29));
        assert!(f.bottlerocket);
    }

    #[test]
    fn bottlerocket_dotted_keys_and_inline_tables() {
        let f = parse("settings.kubernetes.max-pods = 58\nsettings.kubernetes.node-labels = { team = \"ml\", \"example.com/tier\" = \"gpu\" }\n[settings.kubernetes.node-taints]\nnvidia = \"true:NoSchedule\"\n");
        assert!(f.bottlerocket);
        assert_eq!(f.max_pods, Some(58));
        assert_eq!(f.labels.get("team").map(String::as_str), Some("ml"));
        assert_eq!(
            f.labels.get("example.com/tier").map(String::as_str),
            Some("gpu")
        );
        assert_eq!(f.taints, vec![taint("nvidia", "true", "NoSchedule")]);
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
    }

    #[test]
    fn bottlerocket_wrong_types_and_broken_toml_are_warnings() {
        let f = parse("[settings.kubernetes]\nmax-pods = \"many\"\n[settings.kubernetes.node-labels]\nteam = 3\n");
        assert!(f.max_pods.is_none() && f.labels.is_empty());
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
        assert!(f
            .warnings
            .iter()
            .any(|w| w.contains("max-pods") && w.contains("many")));
        let f = parse("[settings.kubernetes\nmax-pods = 3\n");
        assert!(!f.bottlerocket);
        assert!(f.warnings[0].contains("not valid TOML"), "{:?}", f.warnings);
        // A shell script is not mistaken for TOML.
        let f = parse("#!/bin/bash\n/etc/eks/bootstrap.sh c --kubelet-extra-args '--max-pods=7'\n");
        assert!(!f.bottlerocket && f.warnings.is_empty());
        assert_eq!(f.max_pods, Some(7));
    }

    #[test]
    fn bad_values_become_warnings_naming_the_value() {
        let f = parse("/etc/eks/bootstrap.sh c --kubelet-extra-args '--node-labels=novalue --register-with-taints=k=v:Sometimes --max-pods=lots'");
        assert!(f.labels.is_empty() && f.taints.is_empty() && f.max_pods.is_none());
        assert_eq!(f.warnings.len(), 3, "{:?}", f.warnings);
        assert!(f.warnings[0].contains("novalue"));
        assert!(f.warnings[1].contains("Sometimes"));
        assert!(f.warnings[2].contains("lots"));
    }

    #[test]
    fn garbage_does_not_panic() {
        for s in [
            "",
            "--kubelet-extra-args",
            "--kubelet-extra-args '",
            "Content-Type: multipart/mixed; boundary=\n--\n",
            "kind: NodeConfig\n: : :\n",
            "\u{0}\u{ffff}",
        ] {
            let _ = parse(s);
        }
    }
}
