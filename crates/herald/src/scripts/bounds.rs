//! The bounds every tenant expression must keep before anything parses it: its length and
//! its nesting, measured by a flat scan that cannot recurse. They give a clear answer to
//! the common mistakes and attacks; what still exhausts the parser inside them (a chain of
//! prefix operators, say) is caught by compiling only in the sandbox.

/// Longest expression accepted.
pub const MAX_BYTES: usize = 16 * 1024;
/// Deepest nesting of brackets, string interpolations and `if … end` blocks accepted.
pub const MAX_DEPTH: usize = 64;

/// Why an expression is refused before it is parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutOfBounds {
    #[error("is longer than {MAX_BYTES} bytes")]
    TooLong,
    #[error("is nested deeper than {MAX_DEPTH} levels")]
    TooDeep,
}

/// Checks `code` against [`MAX_BYTES`] and [`MAX_DEPTH`].
pub fn check(code: &str) -> Result<(), OutOfBounds> {
    if code.len() > MAX_BYTES {
        return Err(OutOfBounds::TooLong);
    }
    if depth(code) > MAX_DEPTH {
        return Err(OutOfBounds::TooDeep);
    }
    Ok(())
}

/// Where the scan is: in code, or inside a string literal. A string interpolation `\(…)`
/// is code again, one level deeper, until its closing parenthesis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Code,
    Text,
}

/// The deepest nesting in `code` (an unbalanced expression is measured as written; the
/// compiler refuses it afterwards).
fn depth(code: &str) -> usize {
    let bytes = code.as_bytes();
    // One entry per open bracket or interpolation: what closing it returns to.
    let mut open: Vec<Context> = Vec::new();
    let mut context = Context::Code;
    let (mut deepest, mut i) = (0, 0);
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
                        _ => {}
                    }
                }
                _ => {}
            },
        }
        deepest = deepest.max(open.len());
        i += 1;
    }
    deepest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nesting_counts_brackets_interpolations_and_if_blocks() {
        assert_eq!(depth(".a"), 0);
        assert_eq!(depth("(.a | [.b, {c: .d}])"), 3);
        assert_eq!(depth(r#""\(.a) and \(.b)""#), 1);
        assert_eq!(depth(r#""\("\(.a)")""#), 2, "an interpolation inside an interpolation");
        assert_eq!(depth("if .a then (if .b then 1 else 2 end) else 3 end"), 3);
        assert_eq!(depth(".end | $if | .if"), 0, "names are not keywords");
    }

    #[test]
    fn strings_and_comments_do_not_count() {
        assert_eq!(depth(r#"".a((((([[[" | .b"#), 0);
        assert_eq!(depth(r#""a \" (((" | .b"#), 0, "an escaped quote does not end the string");
        assert_eq!(depth("# ((((((\n.a"), 0);
        assert_eq!(depth(r#""\\" | (.a)"#), 1, "an escaped backslash ends before the quote");
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
    }
}
