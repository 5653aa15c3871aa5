//! Kubelet flags from launch-template user data: EKS `bootstrap.sh
//! --kubelet-extra-args`, nodeadm `NodeConfig` (plain or inside MIME multipart), and
//! Bottlerocket TOML. Pure; never fails, problems come back as warnings.

use std::collections::BTreeMap;

use base64::Engine as _;

use super::allocatable::{self, Reservations};
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
    /// kube-reserved, system-reserved and hard eviction thresholds it sets.
    pub reservations: Reservations,
    /// `--pods-per-core` / `podsPerCore`: max pods is at most this times the vCPUs.
    pub pods_per_core: Option<i64>,
    /// AL2 `bootstrap.sh --use-max-pods false`: kubelet keeps its own default of 110
    /// unless `--max-pods` is given.
    pub use_max_pods: Option<bool>,
    pub warnings: Vec<String>,
}

/// Most bytes of user data read (EC2 takes 16 KB, base64): more is not read at all.
pub const MAX_USER_DATA_BYTES: usize = 64 * 1024;
/// Most MIME parts, kubelet flags, labels and taints read from one user data.
pub const MAX_PARTS: usize = 16;
pub const MAX_FLAGS: usize = 512;
pub const MAX_LABELS: usize = 128;
pub const MAX_TAINTS: usize = 64;
/// Most characters of a value a warning repeats.
const SHOWN_MAX: usize = 80;

/// Settings that change what a node offers, read into the template.
const READ_FLAGS: [&str; 8] = [
    "--node-labels",
    "--register-with-taints",
    "--max-pods",
    "--kube-reserved",
    "--system-reserved",
    "--eviction-hard",
    "--pods-per-core",
    "--register-node",
];
/// KubeletConfiguration fields (nodeadm `spec.kubelet.config`) read.
const READ_CONFIG: [&str; 7] = [
    "maxPods",
    "registerWithTaints",
    "kubeReserved",
    "systemReserved",
    "evictionHard",
    "podsPerCore",
    "registerNode",
];
/// Bottlerocket `settings.kubernetes` keys read.
const READ_BOTTLEROCKET: [&str; 6] = [
    "node-labels",
    "node-taints",
    "max-pods",
    "kube-reserved",
    "system-reserved",
    "eviction-hard",
];

/// Parses user data of any supported shape.
/// Bounded: user data over [`MAX_USER_DATA_BYTES`] is not read (a warning says so),
/// and at most [`MAX_PARTS`] parts, [`MAX_FLAGS`] flags, [`MAX_LABELS`] labels and
/// [`MAX_TAINTS`] taints are; a setting that cannot be read is a warning naming the
/// field and value, never a guess.
pub fn parse(user_data: &str) -> KubeletFlags {
    let mut out = KubeletFlags {
        windows: is_windows_user_data(user_data),
        ..KubeletFlags::default()
    };
    if user_data.len() > MAX_USER_DATA_BYTES {
        out.warnings.push(format!(
            "user data is {} bytes, more than {MAX_USER_DATA_BYTES}: not read (no labels, taints or kubelet settings from it)",
            user_data.len()
        ));
        return out;
    }
    let parts = mime_parts(user_data);
    if parts.len() > MAX_PARTS {
        out.warnings.push(format!(
            "user data has {} MIME parts: only the first {MAX_PARTS} are read",
            parts.len()
        ));
    }
    for part in parts.iter().take(MAX_PARTS) {
        parse_part(part, &mut out);
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
        bootstrap_options(text, out);
        let flags = shell_kubelet_flags(text);
        if flags.len() > MAX_FLAGS {
            out.warnings.push(format!(
                "user data has {} kubelet flags: only the first {MAX_FLAGS} are read",
                flags.len()
            ));
        }
        for flag in flags.iter().take(MAX_FLAGS) {
            apply_flag(flag, out);
        }
    }
}

/// The AL2 `bootstrap.sh` options that change what the node offers, besides
/// `--kubelet-extra-args`: `--use-max-pods false` (read) and `--local-disks`
/// (instance-store volumes as kubelet's storage: not modelled, said).
fn bootstrap_options(script: &str, out: &mut KubeletFlags) {
    if !script.contains("bootstrap.sh") {
        return;
    }
    let joined = script.replace("\\\n", " ");
    let words: Vec<&str> = joined.split_whitespace().collect();
    for (i, w) in words.iter().enumerate() {
        let (name, inline) = match w.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (*w, None),
        };
        let value = || {
            inline
                .or_else(|| words.get(i + 1).copied())
                .unwrap_or("")
                .trim_matches(['"', '\''])
        };
        match name {
            "--use-max-pods" => match value() {
                "true" => out.use_max_pods = Some(true),
                "false" => out.use_max_pods = Some(false),
                v => out.warnings.push(format!(
                    "user data bootstrap.sh --use-max-pods {}: not true or false",
                    shown_str(v)
                )),
            },
            "--local-disks" => out.warnings.push(format!(
                "user data bootstrap.sh --local-disks {}: instance-store volumes become kubelet's storage, which the template does not model (it counts the root volume)",
                shown_str(value())
            )),
            _ => {}
        }
    }
}

/// A value as a warning repeats it: quoted, escaped, at most [`SHOWN_MAX`] chars.
fn shown_str(v: &str) -> String {
    let mut out = String::from("\"");
    for (n, c) in v.chars().enumerate() {
        if n == SHOWN_MAX {
            out.push_str(&format!("\"... ({} bytes)", v.len()));
            return out;
        }
        out.extend(c.escape_debug());
    }
    out.push('"');
    out
}

/// The read setting `key` is one letter or two away from, when it is not one:
/// a misspelt setting is named, not dropped. Case, `-` and `_` do not count.
fn near_miss<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    let norm = |s: &str| -> Vec<char> {
        s.chars()
            .filter(|c| *c != '-' && *c != '_')
            .flat_map(char::to_lowercase)
            .collect()
    };
    if known.contains(&key) || key.len() > 64 {
        return None;
    }
    let k = norm(key);
    known.iter().copied().find(|cand| {
        let c = norm(cand);
        k == c || (k.len() > 4 && edit_distance(&k, &c) <= 2)
    })
}

/// Levenshtein distance of two short strings.
fn edit_distance(a: &[char], b: &[char]) -> usize {
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// A label as kubelet accepts it in `--node-labels`: a qualified name (optional DNS
/// subdomain prefix of up to 253 chars, `/`, a name of up to 63) and a value of up
/// to 63 chars, alphanumerics with `-`, `_`, `.` inside. Err says what is wrong.
pub fn check_label(key: &str, value: &str) -> Result<(), String> {
    check_qualified_name(key).map_err(|e| format!("key {}: {e}", shown_str(key)))?;
    if !value.is_empty() && !is_name_part(value) {
        return Err(format!(
            "value {}: not up to 63 alphanumerics, '-', '_' or '.', beginning and ending alphanumeric",
            shown_str(value)
        ));
    }
    Ok(())
}

fn is_name_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let ok = !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|l| {
                let b = l.as_bytes();
                !b.is_empty()
                    && b.len() <= 63
                    && b[0].is_ascii_alphanumeric()
                    && b[b.len() - 1].is_ascii_alphanumeric()
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
            });
        if !ok {
            return Err("the prefix is not a DNS subdomain".into());
        }
    }
    if !is_name_part(name) {
        return Err("the name is not up to 63 alphanumerics, '-', '_' or '.'".into());
    }
    Ok(())
}

/// Adds a label read from `field`, or says why not.
fn add_label(out: &mut KubeletFlags, field: &str, k: &str, v: &str) {
    if let Err(e) = check_label(k, v) {
        out.warnings.push(format!("user data {field}: {e}"));
        return;
    }
    if out.labels.len() >= MAX_LABELS && !out.labels.contains_key(k) {
        out.warnings.push(format!(
            "user data {field}: more than {MAX_LABELS} labels; {} and the rest not read",
            shown_str(k)
        ));
        return;
    }
    out.labels.insert(k.to_string(), v.to_string());
}

/// Adds a taint read from `field` (`key=value:Effect`), or says why not.
fn add_taint(out: &mut KubeletFlags, field: &str, spec: &str) {
    if spec.len() > 512 {
        out.warnings.push(format!(
            "user data {field}: taint {} is longer than 512 bytes; not read",
            shown_str(spec)
        ));
        return;
    }
    match parse_taint(spec).and_then(|t| {
        check_qualified_name(&t.key)
            .map_err(|e| format!("taint key {}: {e}", shown_str(&t.key)))?;
        if !t.value.is_empty() && !is_name_part(&t.value) {
            return Err(format!(
                "taint value {}: not a label value",
                shown_str(&t.value)
            ));
        }
        Ok(t)
    }) {
        Ok(t) if out.taints.len() >= MAX_TAINTS => out.warnings.push(format!(
            "user data {field}: more than {MAX_TAINTS} taints; {} and the rest not read",
            shown_str(&t.key)
        )),
        Ok(t) => {
            out.taints
                .retain(|x| !(x.key == t.key && x.effect == t.effect));
            out.taints.push(t);
        }
        Err(e) => out.warnings.push(format!("user data {field}: {e}")),
    }
}

/// Which reservation map a setting fills.
#[derive(Clone, Copy)]
enum Map {
    Kube,
    System,
}

/// One `resource=quantity` of kube-reserved or system-reserved.
fn add_reserved(out: &mut KubeletFlags, field: &str, which: Map, resource: &str, q: &str) {
    let r = match which {
        Map::Kube => &mut out.reservations.kube_reserved,
        Map::System => &mut out.reservations.system_reserved,
    };
    let read = match resource.trim() {
        "cpu" => allocatable::cpu_millis(q).map(|v| r.cpu_millis = Some(v)),
        "memory" => allocatable::quantity_mib(q).map(|v| r.memory_mib = Some(v)),
        "ephemeral-storage" => allocatable::quantity_mib(q).map(|v| r.ephemeral_mib = Some(v)),
        // Process ids are not something a template offers.
        "pid" => Ok(()),
        other => Err(format!(
            "resource {} is not cpu, memory, ephemeral-storage or pid",
            shown_str(other)
        )),
    };
    if let Err(e) = read {
        out.warnings.push(format!(
            "user data {field} {}={}: {e}; the AMI's default is kept",
            shown_str(resource.trim()),
            shown_str(q.trim())
        ));
    }
}

/// One hard eviction signal: `memory.available` and `nodefs.available` change
/// allocatable; the other signals kubelet knows do not.
fn add_eviction(out: &mut KubeletFlags, field: &str, signal: &str, v: &str) {
    let signal = signal.trim();
    let slot = match signal {
        "memory.available" => &mut out.reservations.eviction_memory,
        "nodefs.available" => &mut out.reservations.eviction_nodefs,
        "nodefs.inodesFree"
        | "imagefs.available"
        | "imagefs.inodesFree"
        | "containerfs.available"
        | "containerfs.inodesFree"
        | "pid.available"
        | "allocatableMemory.available" => return,
        other => {
            out.warnings.push(format!(
                "user data {field}: signal {} is not one kubelet knows",
                shown_str(other)
            ));
            return;
        }
    };
    match allocatable::threshold(v) {
        Ok(t) => *slot = Some(t),
        Err(e) => out.warnings.push(format!(
            "user data {field} {}={}: {e}; the AMI's default is kept",
            shown_str(signal),
            shown_str(v.trim())
        )),
    }
}

/// `--max-pods` and its spellings: a positive number up to 10 000.
fn read_max_pods(out: &mut KubeletFlags, field: &str, v: Option<i64>, shown: &str) {
    match v {
        Some(n) if (1..=10_000).contains(&n) => out.max_pods = Some(n),
        _ => out.warnings.push(format!(
            "user data {field} {shown}: not a number from 1 to 10000"
        )),
    }
}

fn read_pods_per_core(out: &mut KubeletFlags, field: &str, v: Option<i64>, shown: &str) {
    match v {
        // 0 is kubelet's "no limit".
        Some(0) => out.pods_per_core = None,
        Some(n) if (1..=10_000).contains(&n) => out.pods_per_core = Some(n),
        _ => out.warnings.push(format!(
            "user data {field} {shown}: not a number from 0 to 10000"
        )),
    }
}

fn read_register_node(out: &mut KubeletFlags, field: &str, v: Option<bool>, shown: &str) {
    match v {
        Some(true) => {}
        Some(false) => out.warnings.push(format!(
            "user data {field} false: nodes of this group never register; CA counts them as unregistered and removes them"
        )),
        None => out
            .warnings
            .push(format!("user data {field} {shown}: not true or false")),
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
    let (name, value) = match flag.split_once('=') {
        Some((n, v)) => (n.trim(), v.trim().trim_matches(['"', '\''])),
        None => (flag.trim(), ""),
    };
    if !name.starts_with("--") {
        return;
    }
    match name {
        "--node-labels" => {
            for kv in value.split(',').filter(|s| !s.trim().is_empty()) {
                match kv.split_once('=') {
                    Some((k, v)) if !k.trim().is_empty() => {
                        add_label(out, "--node-labels", k.trim(), v.trim())
                    }
                    _ => out.warnings.push(format!(
                        "user data --node-labels: {} is not key=value",
                        shown_str(kv)
                    )),
                }
            }
        }
        "--register-with-taints" => {
            for t in value.split(',').filter(|s| !s.trim().is_empty()) {
                add_taint(out, "--register-with-taints", t.trim());
            }
        }
        "--max-pods" => read_max_pods(out, "--max-pods", value.parse().ok(), &shown_str(value)),
        "--pods-per-core" => {
            read_pods_per_core(out, "--pods-per-core", value.parse().ok(), &shown_str(value))
        }
        "--kube-reserved" | "--system-reserved" => {
            let which = if name == "--kube-reserved" {
                Map::Kube
            } else {
                Map::System
            };
            for kv in value.split(',').filter(|s| !s.trim().is_empty()) {
                match kv.split_once('=') {
                    Some((r, q)) => add_reserved(out, name, which, r, q),
                    None => out.warnings.push(format!(
                        "user data {name}: {} is not resource=quantity",
                        shown_str(kv)
                    )),
                }
            }
        }
        "--eviction-hard" => {
            for sv in value.split(',').filter(|s| !s.trim().is_empty()) {
                match sv.split_once('<') {
                    Some((sig, v)) => add_eviction(out, "--eviction-hard", sig, v),
                    None => out.warnings.push(format!(
                        "user data --eviction-hard: {} is not signal<quantity",
                        shown_str(sv)
                    )),
                }
            }
        }
        "--register-node" => {
            let v = if value.is_empty() { "true" } else { value };
            read_register_node(out, "--register-node", v.parse().ok(), &shown_str(v))
        }
        "--register-schedulable" if value == "false" => out.warnings.push(
            "user data --register-schedulable=false: nodes register unschedulable, which the template does not model".into(),
        ),
        "--reserved-cpus" => out.warnings.push(format!(
            "user data --reserved-cpus={}: replaces kube-reserved and system-reserved cpu with a CPU set, which the template does not model",
            shown_str(value)
        )),
        other => {
            let bare = other.trim_start_matches('-');
            let read: Vec<&str> = READ_FLAGS.iter().map(|f| &f[2..]).collect();
            if let Some(meant) = near_miss(bare, &read) {
                out.warnings.push(format!(
                    "user data kubelet flag {}: not a flag kubelet knows (--{meant}?); not read",
                    shown_str(other)
                ));
            }
        }
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

/// nodeadm NodeConfig: `spec.kubelet.config` (a KubeletConfiguration: maxPods,
/// registerWithTaints, kubeReserved, systemReserved, evictionHard, podsPerCore,
/// registerNode) then `spec.kubelet.flags`, which kubelet lets win over its config
/// (`--register-with-taints` replaces the config's taints).
fn parse_nodeadm(text: &str, out: &mut KubeletFlags) {
    let doc: serde_json::Value = match serde_saphyr::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let why = e.to_string();
            out.warnings.push(format!(
                "user data NodeConfig does not parse: {}",
                shown_str(why.lines().next().unwrap_or_default())
            ));
            return;
        }
    };
    let kubelet = &doc["spec"]["kubelet"];
    if let Some(local) = doc["spec"]["instance"]["localStorage"]["strategy"].as_str() {
        out.warnings.push(format!(
            "user data spec.instance.localStorage.strategy {}: instance-store volumes become kubelet's storage, which the template does not model (it counts the root volume)",
            shown_str(local)
        ));
    }
    let flags = match &kubelet["flags"] {
        serde_json::Value::Null => Vec::new(),
        serde_json::Value::Array(a) => a.clone(),
        _ => {
            out.warnings
                .push("user data spec.kubelet.flags: not a list; not read".into());
            Vec::new()
        }
    };
    let mut split = Vec::new();
    for f in &flags {
        match f.as_str() {
            Some(f) => split.extend(split_args(f)),
            None => out.warnings.push(format!(
                "user data spec.kubelet.flags: {} is not a string; not read",
                shown_str(&f.to_string())
            )),
        }
    }
    if split.len() > MAX_FLAGS {
        out.warnings.push(format!(
            "user data spec.kubelet.flags has {} flags: only the first {MAX_FLAGS} are read",
            split.len()
        ));
    }
    split.truncate(MAX_FLAGS);
    let flag_taints = split
        .iter()
        .any(|f| f.trim().starts_with("--register-with-taints"));
    // The config first, into its own record: the flags win over it.
    let config = &kubelet["config"];
    let mut cfg = KubeletFlags::default();
    match config {
        serde_json::Value::Object(m) => apply_kubelet_config(m, &mut cfg),
        serde_json::Value::Null => {}
        _ => cfg
            .warnings
            .push("user data spec.kubelet.config: not a mapping; not read".into()),
    }
    out.warnings.append(&mut cfg.warnings);
    out.max_pods = cfg.max_pods.or(out.max_pods);
    out.pods_per_core = cfg.pods_per_core.or(out.pods_per_core);
    out.reservations.merge(&cfg.reservations);
    if !flag_taints {
        for t in cfg.taints {
            add_taint(
                out,
                "spec.kubelet.config.registerWithTaints",
                &format!("{}={}:{}", t.key, t.value, t.effect),
            );
        }
    }
    for flag in &split {
        apply_flag(flag, out);
    }
}

/// The fields of a KubeletConfiguration that change what the node offers.
fn apply_kubelet_config(cfg: &serde_json::Map<String, serde_json::Value>, out: &mut KubeletFlags) {
    use serde_json::Value;
    let field = |k: &str| format!("spec.kubelet.config.{k}");
    for (k, v) in cfg {
        match k.as_str() {
            "maxPods" => read_max_pods(out, &field(k), v.as_i64(), &shown_str(&v.to_string())),
            "podsPerCore" => {
                read_pods_per_core(out, &field(k), v.as_i64(), &shown_str(&v.to_string()))
            }
            "registerNode" => {
                read_register_node(out, &field(k), v.as_bool(), &shown_str(&v.to_string()))
            }
            "registerWithTaints" => {
                let Some(list) = v.as_array() else {
                    out.warnings.push(format!(
                        "user data {}: not a list of taints; not read",
                        field(k)
                    ));
                    continue;
                };
                for (i, t) in list.iter().enumerate() {
                    let at = format!("{}[{i}]", field(k));
                    let key = t["key"].as_str().unwrap_or_default();
                    let value = match &t["value"] {
                        Value::Null => "",
                        Value::String(s) => s.as_str(),
                        other => {
                            out.warnings.push(format!(
                                "user data {at}.value {}: not a string; the taint is not read",
                                shown_str(&other.to_string())
                            ));
                            continue;
                        }
                    };
                    let Some(effect) = t["effect"].as_str() else {
                        out.warnings.push(format!(
                            "user data {at}: no effect (NoSchedule, PreferNoSchedule, NoExecute); the taint {} is not read",
                            shown_str(key)
                        ));
                        continue;
                    };
                    add_taint(out, &at, &format!("{key}={value}:{effect}"));
                }
            }
            "kubeReserved" | "systemReserved" => {
                let which = if k == "kubeReserved" { Map::Kube } else { Map::System };
                let Some(m) = v.as_object() else {
                    out.warnings.push(format!("user data {}: not a mapping; not read", field(k)));
                    continue;
                };
                for (r, q) in m {
                    match q.as_str() {
                        Some(q) => add_reserved(out, &field(k), which, r, q),
                        None => out.warnings.push(format!(
                            "user data {}.{r:.64} {}: not a quantity string; the AMI's default is kept",
                            field(k),
                            shown_str(&q.to_string())
                        )),
                    }
                }
            }
            "evictionHard" => {
                let Some(m) = v.as_object() else {
                    out.warnings.push(format!("user data {}: not a mapping; not read", field(k)));
                    continue;
                };
                for (sig, q) in m {
                    match q.as_str() {
                        Some(q) => add_eviction(out, &field(k), sig, q),
                        None => out.warnings.push(format!(
                            "user data {}.{sig:.64} {}: not a string; the AMI's default is kept",
                            field(k),
                            shown_str(&q.to_string())
                        )),
                    }
                }
            }
            "reservedSystemCPUs" => out.warnings.push(format!(
                "user data {} {}: replaces kube-reserved and system-reserved cpu with a CPU set, which the template does not model",
                field(k),
                shown_str(&v.to_string())
            )),
            "nodeLabels" => out.warnings.push(format!(
                "user data {}: not a KubeletConfiguration field, kubelet ignores it; give labels as --node-labels in spec.kubelet.flags (not read)",
                field(k)
            )),
            other => {
                if let Some(meant) = near_miss(other, &READ_CONFIG) {
                    out.warnings.push(format!(
                        "user data {}: not a KubeletConfiguration field ({meant}?); not read",
                        field(other)
                    ));
                }
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

/// `node-labels`, `node-taints` (a value or a list of `value:Effect`), `max-pods`,
/// `kube-reserved`, `system-reserved` and `eviction-hard` of `settings.kubernetes`.
fn apply_bottlerocket(k8s: &toml::Table, out: &mut KubeletFlags) {
    for (key, v) in k8s {
        let field = format!("settings.kubernetes.{key}");
        match key.as_str() {
            "node-labels" => {
                let Some(labels) = v.as_table() else {
                    out.warnings
                        .push(format!("user data {field} = {}: not a table", shown(v)));
                    continue;
                };
                for (k, v) in labels {
                    match v.as_str() {
                        Some(v) => add_label(out, "node-labels", k, v),
                        None => out.warnings.push(format!(
                            "user data node-labels.{k:.64} = {}: not a string",
                            shown(v)
                        )),
                    }
                }
            }
            "node-taints" => {
                let Some(taints) = v.as_table() else {
                    out.warnings
                        .push(format!("user data {field} = {}: not a table", shown(v)));
                    continue;
                };
                for (k, v) in taints {
                    let values: Vec<&toml::Value> = match v {
                        toml::Value::Array(a) => a.iter().collect(),
                        one => vec![one],
                    };
                    for val in values {
                        match val.as_str() {
                            Some(val) => add_taint(out, "node-taints", &format!("{k}={val}")),
                            None => out.warnings.push(format!(
                                "user data node-taints.{k:.64} = {}: not a string",
                                shown(val)
                            )),
                        }
                    }
                }
            }
            "max-pods" => read_max_pods(out, "max-pods =", v.as_integer(), &shown(v)),
            "kube-reserved" | "system-reserved" => {
                let which = if key == "kube-reserved" {
                    Map::Kube
                } else {
                    Map::System
                };
                let Some(m) = v.as_table() else {
                    out.warnings
                        .push(format!("user data {field} = {}: not a table", shown(v)));
                    continue;
                };
                for (r, q) in m {
                    match q.as_str() {
                        Some(q) => add_reserved(out, &field, which, r, q),
                        None => out.warnings.push(format!(
                            "user data {field}.{r:.64} = {}: not a quantity string; the AMI's default is kept",
                            shown(q)
                        )),
                    }
                }
            }
            "eviction-hard" => {
                let Some(m) = v.as_table() else {
                    out.warnings
                        .push(format!("user data {field} = {}: not a table", shown(v)));
                    continue;
                };
                for (sig, q) in m {
                    match q.as_str() {
                        Some(q) => add_eviction(out, &field, sig, q),
                        None => out.warnings.push(format!(
                            "user data {field}.{sig:.64} = {}: not a string; the AMI's default is kept",
                            shown(q)
                        )),
                    }
                }
            }
            other => {
                if let Some(meant) = near_miss(other, &READ_BOTTLEROCKET) {
                    out.warnings.push(format!(
                        "user data {field}: not a Bottlerocket setting ({meant}?); not read"
                    ));
                }
            }
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

    fn nodeadm(config: &str, flags: &[&str]) -> KubeletFlags {
        let mut doc = String::from(
            "apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  cluster:\n    name: c\n  kubelet:\n",
        );
        if !config.is_empty() {
            doc.push_str("    config:\n");
            for l in config.lines() {
                doc.push_str(&format!("      {l}\n"));
            }
        }
        if !flags.is_empty() {
            doc.push_str("    flags:\n");
            for f in flags {
                doc.push_str(&format!("      - {f:?}\n"));
            }
        }
        parse(&doc)
    }

    fn al2(extra: &str) -> KubeletFlags {
        parse(&format!(
            "#!/bin/bash\n/etc/eks/bootstrap.sh my-cluster --kubelet-extra-args '{extra}'\n"
        ))
    }

    fn bottlerocket(settings: &str) -> KubeletFlags {
        parse(&format!("[settings.kubernetes]\n{settings}\n"))
    }

    #[test]
    fn nodeadm_register_with_taints_in_the_kubelet_config_are_read() {
        let f = nodeadm(
            "registerWithTaints:\n  - key: dedicated\n    value: gpu\n    effect: NoSchedule\n  - key: spot\n    effect: PreferNoSchedule\nmaxPods: 20",
            &[],
        );
        assert_eq!(
            f.taints,
            vec![
                taint("dedicated", "gpu", "NoSchedule"),
                taint("spot", "", "PreferNoSchedule")
            ]
        );
        assert_eq!(f.max_pods, Some(20));
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
    }

    #[test]
    fn nodeadm_flags_win_over_the_kubelet_config() {
        let f = nodeadm(
            "registerWithTaints:\n  - key: from-config\n    effect: NoSchedule\nmaxPods: 20\nkubeReserved:\n  cpu: 100m",
            &[
                "--register-with-taints=from-flag=x:NoExecute",
                "--max-pods=30",
                "--kube-reserved=cpu=300m",
            ],
        );
        assert_eq!(f.taints, vec![taint("from-flag", "x", "NoExecute")]);
        assert_eq!(f.max_pods, Some(30));
        assert_eq!(f.reservations.kube_reserved.cpu_millis, Some(300));
    }

    #[test]
    fn nodeadm_bad_taints_name_the_field_and_value() {
        let f = nodeadm(
            "registerWithTaints:\n  - key: a\n    effect: Sometimes\n  - key: b\n  - key: \"bad key!\"\n    effect: NoSchedule\n  - key: c\n    value: 3\n    effect: NoSchedule",
            &[],
        );
        assert!(f.taints.is_empty(), "{:?}", f.taints);
        assert_eq!(f.warnings.len(), 4, "{:?}", f.warnings);
        assert!(
            f.warnings[0].contains("registerWithTaints[0]") && f.warnings[0].contains("Sometimes")
        );
        assert!(
            f.warnings[1].contains("registerWithTaints[1]") && f.warnings[1].contains("no effect")
        );
        assert!(f.warnings[2].contains("bad key!"));
        assert!(
            f.warnings[3].contains("registerWithTaints[3].value") && f.warnings[3].contains('3')
        );
        let f = nodeadm("registerWithTaints: dedicated=gpu:NoSchedule", &[]);
        assert!(f.taints.is_empty() && f.warnings[0].contains("not a list"));
    }

    #[test]
    fn nodeadm_node_labels_in_the_config_are_not_a_kubelet_field() {
        let f = nodeadm("nodeLabels:\n  team: ml", &["--node-labels=role=batch"]);
        assert!(
            !f.labels.contains_key("team"),
            "kubelet ignores config.nodeLabels"
        );
        assert_eq!(f.labels["role"], "batch");
        assert!(f.warnings[0].contains("nodeLabels") && f.warnings[0].contains("--node-labels"));
    }

    #[test]
    fn reservations_are_read_in_every_format() {
        let want_kube = allocatable::Reserved {
            cpu_millis: Some(250),
            memory_mib: Some(1024),
            ephemeral_mib: Some(2048),
        };
        let want_sys = allocatable::Reserved {
            cpu_millis: Some(100),
            memory_mib: Some(512),
            ephemeral_mib: None,
        };
        let al2 = al2("--kube-reserved=cpu=250m,memory=1Gi,ephemeral-storage=2Gi --system-reserved=cpu=100m,memory=512Mi --eviction-hard=memory.available<5%,nodefs.available<15%,nodefs.inodesFree<5%");
        let plain = parse("export KUBELET_EXTRA_ARGS='--kube-reserved=cpu=250m,memory=1Gi,ephemeral-storage=2Gi --system-reserved=cpu=100m,memory=512Mi --eviction-hard=memory.available<5%,nodefs.available<15%'\n");
        let al2023 = nodeadm(
            "kubeReserved:\n  cpu: 250m\n  memory: 1Gi\n  ephemeral-storage: 2Gi\nsystemReserved:\n  cpu: 100m\n  memory: 512Mi\nevictionHard:\n  memory.available: 5%\n  nodefs.available: 15%\n  imagefs.available: 10%",
            &[],
        );
        let br = bottlerocket(
            "[settings.kubernetes.kube-reserved]\ncpu = \"250m\"\nmemory = \"1Gi\"\nephemeral-storage = \"2Gi\"\n[settings.kubernetes.system-reserved]\ncpu = \"100m\"\nmemory = \"512Mi\"\n[settings.kubernetes.eviction-hard]\n\"memory.available\" = \"5%\"\n\"nodefs.available\" = \"15%\"",
        );
        for (name, f) in [
            ("al2", al2),
            ("plain", plain),
            ("al2023", al2023),
            ("bottlerocket", br),
        ] {
            assert!(f.warnings.is_empty(), "{name}: {:?}", f.warnings);
            assert_eq!(f.reservations.kube_reserved, want_kube, "{name}");
            assert_eq!(f.reservations.system_reserved, want_sys, "{name}");
            assert_eq!(
                f.reservations.eviction_memory,
                Some(allocatable::Threshold::Percent(500)),
                "{name}"
            );
            assert_eq!(
                f.reservations.eviction_nodefs,
                Some(allocatable::Threshold::Percent(1500)),
                "{name}"
            );
        }
    }

    #[test]
    fn unreadable_reservations_name_the_field_and_value_and_keep_the_default() {
        let f = al2("--kube-reserved=cpu=lots,gpu=1,memory --eviction-hard=memory.available<101%,disk.free<1Gi,nodefs.available");
        assert_eq!(f.reservations, Reservations::default());
        let w = f.warnings.join("\n");
        for needle in [
            "\"cpu\"=\"lots\"",
            "\"gpu\"",
            "\"memory\" is not resource=quantity",
            "101%",
            "disk.free",
            "nodefs.available\" is not signal<quantity",
        ] {
            assert!(w.contains(needle), "{needle} in {w}");
        }
        let f = nodeadm("kubeReserved:\n  memory: 3\nevictionHard: 100Mi", &[]);
        assert!(
            f.warnings[0].contains("kubeReserved.memory"),
            "{:?}",
            f.warnings
        );
        assert!(
            f.warnings[1].contains("evictionHard: not a mapping"),
            "{:?}",
            f.warnings
        );
        let f = bottlerocket("kube-reserved = \"1Gi\"");
        assert!(
            f.warnings[0].contains("settings.kubernetes.kube-reserved"),
            "{:?}",
            f.warnings
        );
    }

    #[test]
    fn max_pods_and_pods_per_core_in_every_format() {
        assert_eq!(
            al2("--max-pods=17 --pods-per-core=4").pods_per_core,
            Some(4)
        );
        assert_eq!(al2("--max-pods=17").max_pods, Some(17));
        let f = nodeadm("maxPods: 40\npodsPerCore: 10", &[]);
        assert_eq!((f.max_pods, f.pods_per_core), (Some(40), Some(10)));
        assert_eq!(bottlerocket("max-pods = 12").max_pods, Some(12));
        let f = al2("--max-pods=0 --pods-per-core=-1");
        assert_eq!((f.max_pods, f.pods_per_core), (None, None));
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
        let f = nodeadm("maxPods: 99999999999", &[]);
        assert!(f.max_pods.is_none() && f.warnings[0].contains("99999999999"));
    }

    #[test]
    fn al2_bootstrap_use_max_pods_false_is_read() {
        let f = parse("#!/bin/bash\n/etc/eks/bootstrap.sh c --use-max-pods false --kubelet-extra-args '--node-labels=a=b'\n");
        assert_eq!(f.use_max_pods, Some(false));
        assert!(f.warnings.is_empty(), "{:?}", f.warnings);
        let f = parse("/etc/eks/bootstrap.sh c --use-max-pods=maybe\n");
        assert_eq!(f.use_max_pods, None);
        assert!(f.warnings[0].contains("maybe"));
    }

    #[test]
    fn settings_the_template_does_not_model_are_named() {
        let f = al2("--reserved-cpus=0-1 --register-node=false --register-schedulable=false");
        assert_eq!(f.warnings.len(), 3, "{:?}", f.warnings);
        assert!(f.warnings[0].contains("--reserved-cpus") && f.warnings[0].contains("0-1"));
        assert!(f.warnings[1].contains("never register"));
        let f = parse("/etc/eks/bootstrap.sh c --local-disks raid0\n");
        assert!(f.warnings[0].contains("--local-disks") && f.warnings[0].contains("raid0"));
        let f = nodeadm("reservedSystemCPUs: \"0\"\nregisterNode: false", &[]);
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
        let f = parse("apiVersion: node.eks.aws/v1alpha1\nkind: NodeConfig\nspec:\n  instance:\n    localStorage:\n      strategy: RAID0\n");
        assert!(f.warnings[0].contains("localStorage") && f.warnings[0].contains("RAID0"));
    }

    #[test]
    fn misspelt_settings_are_named_not_dropped() {
        let f = al2(
            "--node-label=a=b --register-with-taint=k:NoSchedule --v=2 --cloud-provider=external",
        );
        assert!(f.labels.is_empty() && f.taints.is_empty());
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
        assert!(f.warnings[0].contains("--node-labels?"));
        assert!(f.warnings[1].contains("--register-with-taints?"));
        let f = nodeadm("registerWithTaint:\n  - key: a\n    effect: NoSchedule\nmaxpods: 3\nclusterDNS: [10.0.0.10]", &[]);
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
        assert!(f.warnings.iter().any(|w| w.contains("registerWithTaints?")));
        assert!(f.warnings.iter().any(|w| w.contains("maxPods?")));
        let f = bottlerocket("node-label = { a = \"b\" }\nmax-pod = 3\ncluster-name = \"c\"");
        assert_eq!(f.warnings.len(), 2, "{:?}", f.warnings);
    }

    #[test]
    fn labels_and_taints_kubelet_would_refuse_are_named() {
        let f = al2("--node-labels=ok=1,bad/key/x=1,k=has#hash,UPPER.example.com/x=1 --register-with-taints=k=v!:NoSchedule");
        assert_eq!(f.labels.len(), 1, "{:?}", f.labels);
        assert_eq!(f.warnings.len(), 4, "{:?}", f.warnings);
        assert!(f.warnings.iter().any(|w| w.contains("v!")));
    }

    #[test]
    fn everything_read_is_bounded() {
        let big = "x".repeat(MAX_USER_DATA_BYTES + 1);
        let f = parse(&big);
        assert!(
            f.warnings[0].contains("more than 65536"),
            "{:?}",
            f.warnings
        );
        let many: Vec<String> = (0..MAX_LABELS + 5).map(|i| format!("l{i}=v")).collect();
        let f = al2(&format!("--node-labels={}", many.join(",")));
        assert_eq!(f.labels.len(), MAX_LABELS);
        assert!(f
            .warnings
            .iter()
            .any(|w| w.contains("more than 128 labels")));
        let many: Vec<String> = (0..MAX_TAINTS + 5)
            .map(|i| format!("t{i}=v:NoSchedule"))
            .collect();
        let f = al2(&format!("--register-with-taints={}", many.join(",")));
        assert_eq!(f.taints.len(), MAX_TAINTS);
        let long = "v".repeat(1000);
        let f = al2(&format!("--max-pods={long}"));
        assert!(
            f.warnings[0].len() < 300,
            "a warning repeats at most 80 chars of a value"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Whatever the user data: parsing ends, and what it returns is bounded and
        /// valid (the fuzz target `user_data` checks the same, longer).
        #[test]
        fn any_user_data_parses_bounded(
            body in proptest::collection::vec(proptest::prop_oneof![
                proptest::prelude::Just("--node-labels=".to_string()),
                proptest::prelude::Just("--register-with-taints=".to_string()),
                proptest::prelude::Just("--kube-reserved=cpu=".to_string()),
                proptest::prelude::Just("--eviction-hard=memory.available<".to_string()),
                proptest::prelude::Just("kind: NodeConfig\nspec:\n  kubelet:\n    config:\n      ".to_string()),
                proptest::prelude::Just("registerWithTaints:\n        - key: ".to_string()),
                proptest::prelude::Just("[settings.kubernetes]\n".to_string()),
                proptest::prelude::Just("Content-Type: multipart/mixed; boundary=\"B\"\n\n--B\n".to_string()),
                proptest::prelude::Just("/etc/eks/bootstrap.sh c --kubelet-extra-args '".to_string()),
                "[ -~\n]{0,40}",
            ], 0..24)
        ) {
            let text: String = body.concat();
            check_bounded(&parse(&text));
        }
    }

    /// What every parse must return, whatever it was given.
    pub(crate) fn check_bounded(f: &KubeletFlags) {
        assert!(f.labels.len() <= MAX_LABELS);
        assert!(f.taints.len() <= MAX_TAINTS);
        assert!(f.max_pods.is_none_or(|n| (1..=10_000).contains(&n)));
        assert!(f.pods_per_core.is_none_or(|n| (1..=10_000).contains(&n)));
        for (k, v) in &f.labels {
            assert!(check_label(k, v).is_ok(), "{k}={v}");
        }
        for t in &f.taints {
            assert!(matches!(
                t.effect.as_str(),
                "NoSchedule" | "PreferNoSchedule" | "NoExecute"
            ));
        }
        for w in &f.warnings {
            assert!(w.len() <= 1024, "a warning of {} bytes: {w}", w.len());
        }
    }

    #[test]
    fn yaml_aliases_do_not_blow_up() {
        let mut doc = String::from("kind: NodeConfig\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
        for i in 1..12 {
            let p = i - 1;
            doc.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
        }
        // Expanded, the last alias is 10^12 nodes: a parser that expanded it would
        // not return (the test would hang, not fail on a clock); what it returns is
        // bounded.
        let f = parse(&doc);
        check_bounded(&f);
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
