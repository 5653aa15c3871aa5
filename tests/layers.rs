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
    ("telemetry", 0),
    ("cloud", 1),
    ("provider", 2),
    ("scalein", 3),
    ("sim", 3),
    ("interruption", 4),
    ("config", 5),
    ("grpc", 6),
    ("commands", 7),
];

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
    assert!(commands.len() >= 5, "commands found: {commands:?}");
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
