//! The documentation holds together: every relative link of the README, ARCHITECTURE.md,
//! BENCHMARKS.md and the `docs/` pages reaches a file that exists, and a `#fragment` a
//! heading of it; every page of `docs/` is in the index, which the README links; each page
//! has one title.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// The Markdown files that make up the documentation.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> =
        ["README.md", "ARCHITECTURE.md", "BENCHMARKS.md", "fuzz/README.md"].iter().map(|p| root.join(p)).collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The text outside fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.extend(line.split('`').step_by(2).flat_map(|part| [part, " "]));
            out.push('\n');
        }
    }
    out
}

/// The targets of `[text](target)` and `![alt](target)` links.
fn links(text: &str) -> Vec<String> {
    prose(text)
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.trim().to_owned()))
        .collect()
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut found = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            found.insert(slug(line.trim_start_matches('#').trim()));
        }
    }
    found
}

#[test]
fn every_relative_link_reaches_a_file_and_every_fragment_a_heading() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() { page.clone() } else { page.parent().unwrap().join(path) };
            let shown = format!("{}: {target}", page.strip_prefix(root()).unwrap().display());
            if !file.exists() {
                broken.push(format!("{shown} (no such file)"));
            } else if !fragment.is_empty() && !anchors(&std::fs::read_to_string(&file).unwrap()).contains(fragment) {
                broken.push(format!("{shown} (no such heading)"));
            }
        }
    }
    assert!(checked > 100, "only {checked} links found: the parser is off");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_page_is_in_the_index_the_readme_links_and_has_one_title() {
    let root = root();
    let index = std::fs::read_to_string(root.join("docs/README.md")).unwrap();
    let listed: BTreeSet<String> = links(&index).into_iter().collect();
    assert!(links(&std::fs::read_to_string(root.join("README.md")).unwrap()).contains(&"docs/README.md".to_owned()));
    for page in pages().into_iter().filter(|p| p.parent() == Some(&root.join("docs"))) {
        let name = page.file_name().unwrap().to_str().unwrap().to_owned();
        let text = std::fs::read_to_string(&page).unwrap();
        let titles = prose(&text).lines().filter(|l| l.starts_with("# ")).count();
        assert_eq!(titles, 1, "{name} has {titles} titles: one subject per page");
        if name != "README.md" {
            assert!(listed.contains(&name), "docs/{name} is not in the index (docs/README.md)");
        }
    }
}

#[test]
fn the_link_checker_finds_what_it_must() {
    let text = "See [a](x.md#Part) and ![b](img.png), not `[c](code.md)`.\n```\n[d](fenced.md)\n```\n";
    assert_eq!(links(text), ["x.md#Part", "img.png"]);
    assert_eq!(slug("PostgreSQL: many processes, one database"), "postgresql-many-processes-one-database");
    assert_eq!(slug("Herald's additions"), "heralds-additions");
}
