//! The plan of the house, checked: a module imports only the layers below it, and a
//! command never imports another command. A new `crate::` path that runs back up the
//! layers fails here with the file and the line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bottom to top. A module may use modules of a lower rank, never its own rank or
/// above (besides itself). `proto` is generated code every layer may read.
const LAYERS: &[(&str, u8)] = &[
    ("proto", 0),
    ("duration", 0),
    ("clock", 0),
    ("h2_authority", 0),
    ("telemetry", 0),
    ("cloud", 1),
    ("provider", 2),
    ("scalein", 3),
    ("sim", 3),
    ("config", 5),
    ("grpc", 6),
    ("world", 7),
    ("commands", 8),
];

/// Uses the ranks allow that are still wrong: (from, to, why).
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "sim",
        "provider",
        "the fake must not agree with the service through its code (parse on its own)",
    ),
    ("sim", "scalein", "the fake must not run the code it tests"),
    (
        "grpc",
        "cloud",
        "the gRPC layer sees the core's errors, never the cloud's (ProviderError::kind)",
    ),
];

fn forbidden(from: &str, to: &str) -> Option<&'static str> {
    FORBIDDEN
        .iter()
        .find(|(f, t, _)| *f == from && *t == to)
        .map(|(_, _, why)| *why)
}

fn rank(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Code lines of a file (comments and doc comments left out), numbered from 1.
fn code_lines(path: &Path) -> Vec<(usize, String)> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
        .map(|(i, l)| (i + 1, l.to_string()))
        .collect()
}

/// Every `<prefix>name` in a line.
fn paths_after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    line.match_indices(prefix)
        .map(|(i, _)| {
            let rest = &line[i + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            &rest[..end]
        })
        .collect()
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_module_imports_only_the_layers_below_it() {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut wrong = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "main" || top == "lib" {
            continue;
        }
        let Some(own) = rank(&top) else {
            wrong.push(format!(
                "src/{} is in module `{top}`, which has no layer in tests/layers.rs",
                rel.display()
            ));
            continue;
        };
        *seen.entry(top.clone()).or_default() += 1;
        for (n, line) in code_lines(f) {
            if line.contains("crate::{") {
                wrong.push(format!(
                    "src/{}:{n}: grouped `crate::{{..}}` import; name each layer",
                    rel.display()
                ));
            }
            for dep in paths_after(&line, "crate::") {
                if dep == top {
                    continue;
                }
                if let Some(why) = forbidden(&top, dep) {
                    wrong.push(format!(
                        "src/{}:{n}: `{top}` uses `{dep}`: {why}",
                        rel.display()
                    ));
                    continue;
                }
                match rank(dep) {
                    Some(r) if r < own => {}
                    Some(_) => wrong.push(format!(
                        "src/{}:{n}: `{top}` uses `{dep}`, which is not below it",
                        rel.display()
                    )),
                    None => wrong.push(format!(
                        "src/{}:{n}: `crate::{dep}` is not a known layer",
                        rel.display()
                    )),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "layering broken:\n{}", wrong.join("\n"));
    // The check saw the whole house, not an empty folder.
    for (m, _) in LAYERS.iter().filter(|(m, _)| *m != "proto") {
        assert!(seen.contains_key(*m), "no files found for layer {m}");
    }
}

#[test]
fn no_command_imports_another_command() {
    let dir = src().join("commands");
    let commands: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "mod.rs"))
        .map(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    assert!(commands.len() >= 4, "commands found: {commands:?}");
    let mut wrong = Vec::new();
    for cmd in &commands {
        let mut files = Vec::new();
        let path = dir.join(cmd);
        if path.is_dir() {
            rust_files(&path, &mut files);
        } else {
            files.push(dir.join(format!("{cmd}.rs")));
        }
        for f in files {
            // In a command's own folder `super::` is the command itself.
            let top_file = f.parent() == Some(dir.as_path());
            for (n, line) in code_lines(&f) {
                let mut used = paths_after(&line, "commands::");
                if top_file {
                    used.extend(paths_after(&line, "super::"));
                }
                for other in used {
                    if other != cmd && commands.iter().any(|c| c == other) {
                        wrong.push(format!(
                            "{}:{n}: command `{cmd}` uses command `{other}`",
                            f.strip_prefix(src()).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_fake_and_the_grpc_layer_keep_their_distance() {
    assert!(forbidden("sim", "provider").is_some());
    assert!(forbidden("sim", "scalein").is_some());
    assert!(forbidden("grpc", "cloud").is_some());
    assert!(forbidden("sim", "cloud").is_none());
    assert!(forbidden("grpc", "provider").is_none());
}

#[test]
fn the_checker_sees_a_line_that_runs_up() {
    assert_eq!(
        paths_after(
            "use crate::provider::Provider; x(crate::grpc::y)",
            "crate::"
        ),
        vec!["provider", "grpc"]
    );
    assert_eq!(paths_after("super::demo::run()", "super::"), vec!["demo"]);
}

/// A module's path from its file: `sim/http.rs` is `sim::http`, `sim/mod.rs` is `sim`.
fn module_of(rel: &Path) -> Vec<String> {
    let mut m: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if m.last().is_some_and(|l| l == "mod") {
        m.pop();
    }
    m
}

/// The paths a `use` tree names from `s` on (`a::b`, `{a, b::{c, d}}`, `*`), each
/// appended to `base`; and how many bytes the tree took.
fn use_tree(s: &str, base: &[String]) -> (Vec<Vec<String>>, usize) {
    let t = s.trim_start();
    let mut at = s.len() - t.len();
    if let Some(inner) = t.strip_prefix('{') {
        at += 1;
        let mut out = Vec::new();
        let mut rest = inner;
        loop {
            let r = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ',');
            at += rest.len() - r.len();
            rest = r;
            if rest.is_empty() {
                return (out, at);
            }
            if let Some(r) = rest.strip_prefix('}') {
                at += 1;
                let _ = r;
                return (out, at);
            }
            let (paths, took) = use_tree(rest, base);
            if took == 0 {
                // Not a path (e.g. a closure's braces after `crate::f(`): stop here.
                return (out, at);
            }
            out.extend(paths);
            at += took;
            rest = &rest[took..];
        }
    }
    if t.starts_with('*') {
        return (vec![base.to_vec()], at + 1);
    }
    let end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(t.len());
    if end == 0 {
        return (Vec::new(), 0);
    }
    let ident = &t[..end];
    let mut path = base.to_vec();
    if ident != "self" {
        path.push(ident.to_string());
    }
    at += end;
    match t[end..].strip_prefix("::") {
        Some(rest) => {
            let (paths, took) = use_tree(rest, &path);
            if took == 0 {
                (vec![path], at)
            } else {
                (paths, at + 2 + took)
            }
        }
        None => (vec![path], at),
    }
}

/// Every module path a file's code names through `crate::` or `super::`, with its
/// line. Inside a `mod tests` block (the end of a file) `super` is the file itself.
fn named_paths(module: &[String], code: &[(usize, String)]) -> Vec<(Vec<String>, usize)> {
    let mut text = String::new();
    let mut starts = Vec::new();
    let mut test_from = usize::MAX;
    for (n, l) in code {
        if l.trim_start().starts_with("mod tests") && test_from == usize::MAX {
            test_from = text.len();
        }
        starts.push((text.len(), *n));
        text.push_str(l);
        text.push('\n');
    }
    let line_at = |pos: usize| starts.iter().rev().find(|(s, _)| *s <= pos).unwrap().1;
    let mut out = Vec::new();
    for prefix in ["crate::", "super::"] {
        for (i, _) in text.match_indices(prefix) {
            // Only a path's first segment (`super::super::x` once, not twice).
            if text[..i].ends_with("::") {
                continue;
            }
            let own: Vec<String> = if i >= test_from {
                module
                    .iter()
                    .cloned()
                    .chain(["tests".to_string()])
                    .collect()
            } else {
                module.to_vec()
            };
            let mut rest = &text[i + prefix.len()..];
            let base: Vec<String> = if prefix == "crate::" {
                Vec::new()
            } else {
                let mut up = 1;
                while let Some(r) = rest.strip_prefix("super::") {
                    up += 1;
                    rest = r;
                }
                own[..own.len().saturating_sub(up)].to_vec()
            };
            for p in use_tree(rest, &base).0 {
                out.push((p, line_at(i)));
            }
        }
    }
    out
}

/// A file: its name, its module and its code lines.
type SourceFile = (String, Vec<String>, Vec<(usize, String)>);

/// `from` uses `to`, two children of one module: (from, to, where).
type Edge = (Vec<String>, Vec<String>, String);

/// The uses between sibling modules: a file of `a::x` naming `a::y` (or anything in
/// it) is an edge `a::x -> a::y`. A module using its parent or its children is not.
fn sibling_edges(
    files: &[SourceFile],
    modules: &std::collections::BTreeSet<Vec<String>>,
) -> Vec<Edge> {
    let mut edges = Vec::new();
    for (name, module, code) in files {
        for (path, line) in named_paths(module, code) {
            // The module the path is in: its longest prefix that is a module.
            let Some(target) = (0..=path.len())
                .rev()
                .map(|k| path[..k].to_vec())
                .find(|p| modules.contains(p))
            else {
                continue;
            };
            let common = module
                .iter()
                .zip(&target)
                .take_while(|(a, b)| a == b)
                .count();
            if common < module.len() && common < target.len() {
                edges.push((
                    module[..=common].to_vec(),
                    target[..=common].to_vec(),
                    format!("{name}:{line}"),
                ));
            }
        }
    }
    edges
}

/// Each circle of edges once: its modules (sorted, `a::b`) and how it runs,
/// `a -> b (file:line) -> a (file:line)`.
fn circles(edges: &[Edge]) -> Vec<(Vec<String>, String)> {
    let mut found: BTreeMap<Vec<String>, String> = BTreeMap::new();
    for (from, to, at) in edges {
        // The shortest way back from `to` to `from`, breadth first.
        let mut back: BTreeMap<&Vec<String>, (&Vec<String>, &str)> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([to]);
        while let Some(m) = queue.pop_front() {
            if m == from {
                break;
            }
            for (f, t, w) in edges.iter().filter(|(f, _, _)| f == m) {
                if t != to && !back.contains_key(t) {
                    back.insert(t, (f, w));
                    queue.push_back(t);
                }
            }
        }
        if from != to && !back.contains_key(from) {
            continue;
        }
        let mut hops = vec![(to.clone(), at.clone())];
        let mut m = from;
        while m != to {
            let (prev, w) = back[m];
            hops.push((m.clone(), w.to_string()));
            m = prev;
        }
        let mut key: Vec<String> = hops.iter().map(|(m, _)| m.join("::")).collect();
        key.sort();
        let text = hops
            .iter()
            .rev()
            .map(|(m, w)| format!("-> {} ({w})", m.join("::")))
            .collect::<Vec<_>>()
            .join(" ");
        found
            .entry(key)
            .or_insert_with(|| format!("{} {text}", to.join("::")));
    }
    found.into_iter().collect()
}

/// Circles that were there when the check came, in modules their owners are
/// changing: each must go (then leave this list, or the test fails), none may join.
const KNOWN_CIRCLES: &[&[&str]] = &[];

#[test]
fn no_two_sibling_modules_use_each_other() {
    let root = src();
    let mut paths = Vec::new();
    rust_files(&root, &mut paths);
    let mut modules = std::collections::BTreeSet::new();
    let mut files = Vec::new();
    for f in &paths {
        let rel = f.strip_prefix(&root).unwrap();
        let module = module_of(rel);
        if module == ["lib"] || module == ["main"] {
            continue;
        }
        for k in 1..=module.len() {
            modules.insert(module[..k].to_vec());
        }
        files.push((format!("src/{}", rel.display()), module, code_lines(f)));
    }
    let edges = sibling_edges(&files, &modules);
    assert!(
        edges
            .iter()
            .any(|(f, t, _)| f == &["sim".to_string(), "http".to_string()]
                && t == &["sim".to_string(), "store".to_string()]),
        "the check saw no use between sim's modules: {edges:?}"
    );
    let found = circles(&edges);
    let new: Vec<&str> = found
        .iter()
        .filter(|(key, _)| !KNOWN_CIRCLES.iter().any(|k| k == key))
        .map(|(_, text)| text.as_str())
        .collect();
    assert!(
        new.is_empty(),
        "modules that use each other (move the shared part into a module of its own, \
         or make one side not need the other):\n{}",
        new.join("\n")
    );
    for known in KNOWN_CIRCLES {
        assert!(
            found.iter().any(|(key, _)| key == known),
            "{known:?} is no longer a circle: take it off KNOWN_CIRCLES"
        );
    }
}

#[test]
fn the_circle_checker_sees_a_circle_through_any_kind_of_path() {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    assert_eq!(
        use_tree("{a, b::{c, self}, d::*};", &s(&["m"])).0,
        vec![
            s(&["m", "a"]),
            s(&["m", "b", "c"]),
            s(&["m", "b"]),
            s(&["m", "d"])
        ]
    );
    let modules: std::collections::BTreeSet<Vec<String>> = [
        s(&["m"]),
        s(&["m", "a"]),
        s(&["m", "b"]),
        s(&["m", "c"]),
        s(&["m", "c", "deep"]),
    ]
    .into();
    let file = |name: &str, module: &[&str], lines: &[&str]| {
        (
            name.to_string(),
            s(module),
            lines
                .iter()
                .enumerate()
                .map(|(i, l)| (i + 1, l.to_string()))
                .collect::<Vec<_>>(),
        )
    };
    // a -> b -> c -> a, through a grouped multi-line import, a deep file's
    // `super::super::` and a `crate::` path; `mod tests` and the parent do not count.
    let files = vec![
        file("a.rs", &["m", "a"], &["use super::{", "    b::B,", "};"]),
        file(
            "deep.rs",
            &["m", "b"],
            &["fn f() { crate::m::c::deep::g() }"],
        ),
        file("g.rs", &["m", "c", "deep"], &["use super::super::a::A;"]),
        file("mod.rs", &["m"], &["use self::a::A; use crate::m::b::B;"]),
        file("t.rs", &["m", "b"], &["mod tests {", "use super::*;", "}"]),
    ];
    let found = circles(&sibling_edges(&files, &modules));
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0, ["m::a", "m::b", "m::c"], "{found:?}");
    assert!(found[0].1.contains("g.rs:1"), "{found:?}");
    // Without the way back there is no circle.
    let files: Vec<_> = files.into_iter().filter(|f| f.0 != "g.rs").collect();
    assert!(circles(&sibling_edges(&files, &modules)).is_empty());
}

/// The rooms of `src/scalein` (issue 60), bottom to top, and what each may use of
/// scalein besides itself and the shared vocabulary (`request`, `settings`, and what
/// `scalein/mod.rs` re-exports): a room uses only the rooms listed for it.
const SCALEIN_ROOMS: &[(&str, &[&str], &str)] = &[
    ("decide", &[], "pure decisions: no await, no client"),
    (
        "kube",
        &["decide"],
        "Kubernetes access: knows no engine and no stage order",
    ),
    (
        "holds",
        &["decide", "kube"],
        "AWS's word on lifecycle actions: heartbeat pacing, refusals, states; no engine",
    ),
    (
        "stages",
        &["decide", "kube", "holds"],
        "one node's drain, stage by stage",
    ),
    (
        "engine",
        &["decide", "kube", "holds", "stages"],
        "who runs what and when",
    ),
    (
        "sources",
        &["decide", "kube", "holds", "stages", "engine"],
        "outside signals to drain requests",
    ),
    (
        "remove_hooks",
        &["decide"],
        "uninstall: removes the hooks this service created; knows no engine",
    ),
    (
        "progress",
        &["decide", "kube"],
        "where a drain stands, read back from its Node: pure",
    ),
    ("request", &["decide"], "the vocabulary"),
    ("settings", &["decide"], "the vocabulary"),
    ("stats", &[], "the vocabulary"),
];

/// Files that still reach the whole `Engine` through scalein's face (paths under
/// `src/scalein/`; a folder ends in `/`): the debt a narrow context pays off, one file
/// at a time (every stage works through `stages::Stage`, the last one and the list's
/// runner also through a port of their own). None may join.
const ENGINE_REACHED_FROM: &[&str] = &["sources/"];

/// The code of a file before its `mod tests`, numbered as in the file.
fn code_before_tests(f: &Path) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, l) in code_lines(f) {
        if l.trim_start().starts_with("mod tests") {
            break;
        }
        out.push((n, l));
    }
    out
}

/// What scalein's face re-exports of the vocabulary (`request`, `settings`, `stats`):
/// the names a room may write as `crate::scalein::Name`.
fn vocabulary_reexports(face: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(face).unwrap();
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        for module in ["request", "settings", "stats"] {
            let Some(rest) = line.strip_prefix(&format!("pub use {module}::")) else {
                continue;
            };
            let rest = rest
                .trim_end_matches(';')
                .trim_matches(|c| c == '{' || c == '}');
            names.extend(
                rest.split(',')
                    .map(|n| n.trim().to_string())
                    .filter(|n| !n.is_empty()),
            );
        }
    }
    names
}

#[test]
fn each_room_of_scalein_uses_only_the_rooms_below_it() {
    let root = src();
    let dir = root.join("scalein");
    let vocabulary_owned = vocabulary_reexports(&dir.join("mod.rs"));
    let vocabulary: Vec<&str> = vocabulary_owned.iter().map(String::as_str).collect();
    assert!(vocabulary.contains(&"DrainRequest"), "{vocabulary:?}");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut wrong = Vec::new();
    let mut seen = BTreeMap::<&str, usize>::new();
    for f in &files {
        let rel = f.strip_prefix(&root).unwrap();
        let module = module_of(rel);
        if module == ["scalein"] {
            continue;
        }
        let room = module[1].as_str();
        let Some((room, allowed, rule)) = SCALEIN_ROOMS.iter().find(|(r, _, _)| *r == room) else {
            wrong.push(format!(
                "src/{}: room `{room}` has no rule in SCALEIN_ROOMS",
                rel.display()
            ));
            continue;
        };
        *seen.entry(room).or_default() += 1;
        let code = code_before_tests(f);
        for (path, n) in named_paths(&module, &code) {
            if path.len() < 2 || path[0] != "scalein" {
                continue;
            }
            let to = path[1].as_str();
            if to == *room {
                continue;
            }
            // The pure room uses nothing else of scalein, not even the vocabulary.
            if *room == "decide" {
                wrong.push(format!(
                    "src/{}:{n}: scalein::decide ({rule}) uses scalein::{to}",
                    rel.display()
                ));
                continue;
            }
            if ["request", "settings", "stats"].contains(&to) || vocabulary.contains(&to) {
                continue;
            }
            if SCALEIN_ROOMS.iter().any(|(r, _, _)| *r == to) {
                if !allowed.contains(&to) {
                    wrong.push(format!(
                        "src/{}:{n}: scalein::{room} ({rule}) uses scalein::{to}",
                        rel.display()
                    ));
                }
            } else if to == "Engine" {
                if *room != "engine"
                    && !ENGINE_REACHED_FROM.iter().any(|p| {
                        rel.starts_with(Path::new("scalein").join(p))
                            || rel == Path::new("scalein").join(p)
                    })
                {
                    wrong.push(format!(
                        "src/{}:{n}: scalein::{room} ({rule}) reaches the whole Engine",
                        rel.display()
                    ));
                }
            } else {
                // Issue 70: a room's item through the face passes the room rules by.
                wrong.push(format!(
                    "src/{}:{n}: scalein::{room} reaches scalein::{to} through the face: name its room",
                    rel.display()
                ));
            }
        }
        if *room == "decide" {
            for (n, l) in &code {
                for never in [
                    ".await",
                    "kube::Client",
                    "Api<",
                    "Arc<Engine>",
                    "&Engine",
                    "clock::now(",
                    "utc_now",
                    "timestamp_now",
                    "Instant::now",
                ] {
                    if l.contains(never) {
                        wrong.push(format!(
                            "src/{}:{n}: scalein::decide ({rule}) has `{never}`",
                            rel.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "rooms broken:\n{}", wrong.join("\n"));
    for (r, _, _) in SCALEIN_ROOMS {
        assert!(seen.contains_key(r), "no files found for scalein::{r}");
    }
}

/// The calls that end an instance, and the files that may make them: the drain's
/// last stage (which also serves the two ends a source asks for before a drain), and
/// the provider's `TerminateNow`, its ScaleIn when no drain is configured (the
/// provider is below scalein and cannot reach it). The fake cloud and the cloud's
/// own code implement these calls and are not callers.
const ENDS_AN_INSTANCE: &[&str] = &[".terminate_instance(", ".complete_lifecycle_action("];
const MAY_END_AN_INSTANCE: &[&str] = &["scalein/stages/terminate.rs", "provider/mod.rs"];

#[test]
fn one_room_ends_an_instance() {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut wrong = Vec::new();
    let mut found = BTreeMap::<String, usize>::new();
    for f in &files {
        let rel = f
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        if rel.starts_with("cloud/") || rel.starts_with("sim/") {
            continue;
        }
        for (n, l) in code_before_tests(f) {
            for call in ENDS_AN_INSTANCE {
                if l.contains(call) {
                    *found.entry(rel.clone()).or_default() += 1;
                    if !MAY_END_AN_INSTANCE.contains(&rel.as_str()) {
                        wrong.push(format!(
                            "src/{rel}:{n}: `{}` outside the one room that ends an instance",
                            call.trim_matches(|c| c == '.' || c == '(')
                        ));
                    }
                }
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The check saw the calls where they are.
    assert!(
        found.contains_key("scalein/stages/terminate.rs"),
        "{found:?}"
    );
}
