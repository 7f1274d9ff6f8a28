//! The code's layers hold: every `crate::…` path in `crates/herald/src` (tests aside) names
//! a module of its own layer or below, as ARCHITECTURE.md's layer table places them, no
//! modules import each other round in a circle, and every module has a place in the table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// ARCHITECTURE.md's layer table: each module and its layer's number.
fn layers() -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../ARCHITECTURE.md")).unwrap();
    let section = doc.split("\n## Layers\n").nth(1).expect("ARCHITECTURE.md has a Layers section");
    let section = section.split("\n## ").next().unwrap();
    let mut layers = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| ") && !l.starts_with("| layer")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(layer) = cells[1].split(' ').next().and_then(|n| n.parse::<u32>().ok()) else { continue };
        for module in cells[2].split(',').map(|m| m.trim().trim_matches('`')) {
            assert!(layers.insert(module.to_owned(), layer).is_none(), "{module} is in two layers");
        }
    }
    layers
}

/// The crate's top-level modules, as `lib.rs` declares them.
fn modules() -> BTreeSet<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    lib.lines().filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';').map(str::to_owned)).collect()
}

/// The source files of a top-level module.
fn files(module: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let file = src().join(format!("{module}.rs"));
    if file.exists() {
        found.push(file);
    }
    let mut dirs = vec![src().join(module)];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    found
}

/// The code of a file without its test module (at the end, by convention) and comments.
fn code(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap();
    text.lines().map(|l| l.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// The first segment of every `crate::` path in `code`, `use crate::{a, b::c}` included.
fn imported(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for rest in code.split("crate::").skip(1) {
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        names.insert(first_segment(&item));
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            names.insert(first_segment(&item));
        } else {
            names.insert(first_segment(rest));
        }
    }
    names
}

fn first_segment(path: &str) -> String {
    path.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Which modules each module imports, and where.
fn graph() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let modules = modules();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for module in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for file in files(module) {
            let shown = file.strip_prefix(src()).unwrap().display().to_string();
            for target in imported(&code(&std::fs::read_to_string(&file).unwrap())) {
                if modules.contains(&target) && target != *module {
                    edges.entry(target).or_default().insert(shown.clone());
                }
            }
        }
    }
    graph
}

#[test]
fn every_module_has_a_layer_and_no_import_climbs_one() {
    let layers = layers();
    let modules = modules();
    let placed: BTreeSet<String> = layers.keys().cloned().collect();
    assert_eq!(modules, placed, "lib.rs's modules and ARCHITECTURE.md's layer table differ");
    let mut climbing = Vec::new();
    for (module, edges) in graph() {
        for (target, files) in edges {
            if layers[&target] > layers[&module] {
                climbing.push(format!(
                    "{module} (layer {}) imports {target} (layer {}) in {files:?}",
                    layers[&module], layers[&target]
                ));
            }
        }
    }
    assert!(climbing.is_empty(), "imports that climb a layer:\n{}", climbing.join("\n"));
}

#[test]
fn no_modules_import_each_other_in_a_circle() {
    let graph = graph();
    // A module is in a circle when it can reach itself.
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&str> = graph[from].keys().map(String::as_str).collect();
        while let Some(next) = todo.pop() {
            if seen.insert(next.to_owned()) {
                todo.extend(graph[next].keys().map(String::as_str));
            }
        }
        seen
    };
    let circular: Vec<&String> = graph.keys().filter(|m| reaches(m).contains(*m)).collect();
    assert!(circular.is_empty(), "modules in an import circle: {circular:?}");
}

#[test]
fn the_import_reader_sees_paths_groups_and_skips_comments_and_tests() {
    let text = "use crate::a::X;\nuse crate::{b, c::{D, e::F}, g};\n// crate::h\nfn f() { crate::i::j(); }\n#[cfg(test)]\nmod tests { use crate::k; }";
    let found = imported(&code(text));
    assert_eq!(found, ["a", "b", "c", "g", "i"].into_iter().map(String::from).collect());
}
