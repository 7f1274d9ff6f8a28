//! Every SQL statement that reads the same on both backends is written once, in
//! `store/sql.rs`: no statement of `store/sqlite/` is also in `store/postgres/` once
//! placeholders (`?`, `?n`, `$n`) and the `herald.` schema are set aside.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn store() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src/store")
}

/// The string literals of a file (tests aside) that are SQL statements, by their
/// normalised text, with where each is.
fn statements(dir: &str) -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir(store().join(dir)).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (line, literal) in literals(code) {
            if is_statement(&literal) {
                let at = format!("{}:{line}", path.strip_prefix(store()).unwrap().display());
                found.entry(normalised(&literal)).or_default().push(at);
            }
        }
    }
    found
}

/// `"…"` literals (escapes kept as written) with the line each starts on.
fn literals(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        if c == '/' && chars.peek().is_some_and(|(_, n)| *n == '/') {
            chars.by_ref().take_while(|(_, c)| *c != '\n').for_each(drop);
        } else if c == '\'' {
            // A char literal or a lifetime: skip a quoted character, never start a string.
            if let Some((_, '\\')) = chars.peek() {
                chars.nth(1);
            }
        } else if c == '"' {
            let mut literal = String::new();
            while let Some((_, c)) = chars.next() {
                match c {
                    '\\' => literal.extend([c].into_iter().chain(chars.next().map(|(_, c)| c))),
                    '"' => break,
                    _ => literal.push(c),
                }
            }
            found.push((code[..at].lines().count().max(1), literal));
        }
    }
    found
}

fn is_statement(literal: &str) -> bool {
    let head = literal.trim_start().to_ascii_uppercase();
    ["SELECT ", "INSERT ", "UPDATE ", "DELETE ", "WITH "].iter().any(|verb| head.starts_with(verb))
}

/// The statement with the schema dropped, every placeholder as `?`, and whitespace (and a
/// line continuation's backslash) collapsed.
fn normalised(statement: &str) -> String {
    let text = statement.replace("herald.", "").replace("\\\n", " ");
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' || c == '?' {
            while chars.peek().is_some_and(char::is_ascii_digit) {
                chars.next();
            }
            out.push('?');
        } else {
            out.push(c);
        }
    }
    out.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn no_statement_is_written_for_both_backends() {
    let (sqlite, postgres) = (statements("sqlite"), statements("postgres"));
    assert!(sqlite.len() > 50 && postgres.len() > 50, "too few statements found: the reader is off");
    let twice: Vec<String> =
        sqlite.iter().filter_map(|(text, at)| Some(format!("{at:?} and {:?}: {text}", postgres.get(text)?))).collect();
    assert!(
        twice.is_empty(),
        "statements written for both backends (move them to store/sql.rs):\n{}",
        twice.join("\n")
    );
}

#[test]
fn the_statement_reader_sees_through_placeholders_schemas_and_comments() {
    let code =
        "let a = \"SELECT x FROM herald.t WHERE id = $1\"; // \"DELETE FROM t\"\nlet c = 'x';\nlet b = \"not sql\";";
    let found: Vec<String> =
        literals(code).into_iter().filter(|(_, l)| is_statement(l)).map(|(_, l)| normalised(&l)).collect();
    assert_eq!(found, ["SELECT x FROM t WHERE id = ?"]);
    assert_eq!(normalised("UPDATE t SET a = ?2,\n   b = ?10"), normalised("UPDATE herald.t SET a = $2, b = $10"));
}
