//! The bounds every tenant expression must keep before anything parses it: its length, its
//! nesting and its number of operators, measured by a flat scan that cannot recurse. jq's
//! parser and compiler recurse once per nesting level and once per operator of a chain
//! (`1+1+…`, `.|.|…`, `----1`), so the three together bound how deep they go: well inside
//! the worker's stack (the fuzz target `expression_check` checks it). What still exhausts
//! a worker inside them fails that worker only: expressions are compiled nowhere else.

/// Longest expression accepted.
pub const MAX_BYTES: usize = 16 * 1024;
/// Deepest nesting of brackets, string interpolations and `if … end` blocks accepted.
pub const MAX_DEPTH: usize = 64;
/// Most operator characters accepted (`|`, `,`, `+`, `-`, `=`, …: `//=` counts three),
/// `and` and `or` counting one each. Counted by character, because a run such as `----1`
/// is a chain the parser recurses into once per character.
pub const MAX_OPERATORS: usize = 2048;

/// Why an expression is refused before it is parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutOfBounds {
    #[error("is longer than {MAX_BYTES} bytes")]
    TooLong,
    #[error("is nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
    #[error("has more than {MAX_OPERATORS} operators")]
    TooManyOperators,
}

/// Checks `code` against [`MAX_BYTES`], [`MAX_DEPTH`] and [`MAX_OPERATORS`].
pub fn check(code: &str) -> Result<(), OutOfBounds> {
    if code.len() > MAX_BYTES {
        return Err(OutOfBounds::TooLong);
    }
    let shape = shape(code);
    if shape.depth > MAX_DEPTH {
        return Err(OutOfBounds::TooDeep);
    }
    if shape.operators > MAX_OPERATORS {
        return Err(OutOfBounds::TooManyOperators);
    }
    Ok(())
}

/// What the scan measures.
#[derive(Debug, Default, PartialEq, Eq)]
struct Shape {
    depth: usize,
    operators: usize,
}

/// Characters that make up jq's operators.
const OPERATOR: &[u8] = b"|,+-*/%=<>!?";

/// Where the scan is: in code, or inside a string literal. A string interpolation `\(…)`
/// is code again, one level deeper, until its closing parenthesis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Code,
    Text,
}

/// The deepest nesting in `code` and its operators (an unbalanced expression is measured as
/// written; the compiler refuses it afterwards).
fn shape(code: &str) -> Shape {
    let bytes = code.as_bytes();
    // One entry per open bracket or interpolation: what closing it returns to.
    let mut open: Vec<Context> = Vec::new();
    let mut context = Context::Code;
    let (mut deepest, mut operators, mut i) = (0, 0, 0);
    while i < bytes.len() {
        let b = bytes[i];
        match context {
            Context::Text => match b {
                b'\\' if bytes.get(i + 1) == Some(&b'(') => {
                    open.push(Context::Text);
                    context = Context::Code;
                    i += 1;
                }
                b'\\' => i += 1,
                b'"' => context = Context::Code,
                _ => {}
            },
            Context::Code => match b {
                b'"' => context = Context::Text,
                b'#' => {
                    while i < bytes.len() && bytes[i] != b'\n' {
                        i += 1;
                    }
                }
                b'(' | b'[' | b'{' => open.push(Context::Code),
                b')' | b']' | b'}' => context = open.pop().unwrap_or(Context::Code),
                _ if OPERATOR.contains(&b) => operators += 1,
                b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                    let start = i;
                    while i + 1 < bytes.len() && (bytes[i + 1].is_ascii_alphanumeric() || bytes[i + 1] == b'_') {
                        i += 1;
                    }
                    // `.if` and `$end` are names, not keywords.
                    let named = start > 0 && matches!(bytes[start - 1], b'.' | b'$');
                    match &code[start..=i] {
                        "if" if !named => open.push(Context::Code),
                        "end" if !named => {
                            open.pop();
                        }
                        "and" | "or" if !named => operators += 1,
                        _ => {}
                    }
                }
                _ => {}
            },
        }
        deepest = deepest.max(open.len());
        i += 1;
    }
    Shape { depth: deepest, operators }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape_depth(code: &str) -> usize {
        shape(code).depth
    }

    #[test]
    fn nesting_counts_brackets_interpolations_and_if_blocks() {
        assert_eq!(shape_depth(".a"), 0);
        assert_eq!(shape_depth("(.a | [.b, {c: .d}])"), 3);
        assert_eq!(shape_depth(r#""\(.a) and \(.b)""#), 1);
        assert_eq!(shape_depth(r#""\("\(.a)")""#), 2, "an interpolation inside an interpolation");
        assert_eq!(shape_depth("if .a then (if .b then 1 else 2 end) else 3 end"), 3);
        assert_eq!(shape_depth(".end | $if | .if"), 0, "names are not keywords");
    }

    #[test]
    fn strings_and_comments_do_not_count() {
        assert_eq!(shape_depth(r#"".a((((([[[" | .b"#), 0);
        assert_eq!(shape_depth(r#""a \" (((" | .b"#), 0, "an escaped quote does not end the string");
        assert_eq!(shape_depth("# ((((((\n.a"), 0);
        assert_eq!(shape_depth(r#""\\" | (.a)"#), 1, "an escaped backslash ends before the quote");
    }

    #[test]
    fn the_limits_are_inclusive() {
        let at = |n: usize| format!("{}.a{}", "(".repeat(n), ")".repeat(n));
        assert_eq!(check(&at(MAX_DEPTH)), Ok(()));
        assert_eq!(check(&at(MAX_DEPTH + 1)), Err(OutOfBounds::TooDeep));
        assert_eq!(check(&"1".repeat(MAX_BYTES)), Ok(()));
        assert_eq!(check(&"1".repeat(MAX_BYTES + 1)), Err(OutOfBounds::TooLong));
        let unbalanced = "[".repeat(MAX_DEPTH + 1);
        assert_eq!(check(&unbalanced), Err(OutOfBounds::TooDeep), "measured as written");
        let chain = |n: usize| format!("1{}", "+1".repeat(n));
        assert_eq!(check(&chain(MAX_OPERATORS)), Ok(()));
        assert_eq!(check(&chain(MAX_OPERATORS + 1)), Err(OutOfBounds::TooManyOperators));
    }

    #[test]
    fn operators_are_counted_by_character_outside_strings_comments_and_names() {
        let ops = |code: &str| shape(code).operators;
        assert_eq!(ops(".a | .b // .c"), 3);
        assert_eq!(ops(".a |= . + 1"), 3, "`|=` is two characters");
        assert_eq!(ops("----1"), 4, "each prefix minus is a level of the parser");
        assert_eq!(ops(r#"".a|.b|.c" + "x,y""#), 1, "strings do not count");
        assert_eq!(ops(".a and .b or .and"), 2, "a field named `and` is a name");
        assert_eq!(ops("[1,2,3]"), 2);
        assert_eq!(ops("# a | b | c\n.a"), 0, "comments do not count");
    }
}
