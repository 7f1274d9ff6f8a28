//! The jq language itself, through jaq: parsing and compiling an expression (with the
//! position of the first problem), and running a compiled one on one input. Used by the
//! API to check expressions when they are set, and by the sandbox worker to run them.

use jaq_core::data::JustLut;
use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Vars, unwrap_valr};
use jaq_json::Val;

type Data = JustLut<Val>;
type Filter = jaq_core::compile::Filter<jaq_core::Native<Data>>;

/// A compiled expression, ready to run any number of times.
pub struct Program {
    filter: Filter,
    /// The source, to tell the expression's own error texts from quoted values.
    code: String,
}

/// Why an expression does not compile: the first problem and where it is (1-based).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct CompileError {
    pub line: usize,
    pub column: usize,
    pub message: String,
}

impl CompileError {
    fn at(code: &str, part: &str, message: String) -> Self {
        // `part` is a slice of `code` (or empty at its end).
        let offset = if part.is_empty() && !code.as_bytes().as_ptr_range().contains(&part.as_ptr()) {
            code.len()
        } else {
            jaq_core::load::span(code, part).start
        };
        let before = &code[..offset.min(code.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        Self { line, column, message }
    }
}

/// The result of running an expression on one input: its first output, if any. Only the
/// first is computed.
pub enum Output {
    /// The first output, as JSON text.
    Value(String),
    /// The expression produced nothing (`empty`).
    Nothing,
}

impl Program {
    /// Parses and compiles `code` with the standard library (no I/O: jaq has none, and the
    /// sandbox runs with an empty environment, so `$ENV` reveals nothing).
    pub fn compile(code: &str) -> Result<Self, CompileError> {
        let defs = jaq_core::defs().chain(jaq_std::defs()).chain(jaq_json::defs());
        let funs = jaq_core::funs().chain(jaq_std::funs()).chain(jaq_json::funs());
        let arena = Arena::default();
        let modules = Loader::new(defs).load(&arena, File { code, path: () }).map_err(|errors| {
            let first = errors.into_iter().next().map(|(_, e)| e);
            match first {
                Some(jaq_core::load::Error::Lex(errs)) => match errs.into_iter().next() {
                    Some((expected, found)) => CompileError::at(code, found, format!("expected {}", expected.as_str())),
                    None => CompileError::at(code, "", "does not parse".into()),
                },
                Some(jaq_core::load::Error::Parse(errs)) => match errs.into_iter().next() {
                    Some((expected, found)) => {
                        let what = if found.is_empty() { "the end".to_owned() } else { format!("`{found}`") };
                        CompileError::at(code, found, format!("expected {}, found {what}", expected.as_str()))
                    }
                    None => CompileError::at(code, "", "does not parse".into()),
                },
                Some(jaq_core::load::Error::Io(errs)) => {
                    let (path, e) = errs.into_iter().next().unwrap_or_default();
                    CompileError::at(code, path, format!("modules cannot be loaded: {e}"))
                }
                None => CompileError::at(code, "", "does not parse".into()),
            }
        })?;
        let filter = Compiler::default().with_funs(funs).compile(modules).map_err(|errors| {
            match errors.into_iter().next().and_then(|(_, errs)| errs.into_iter().next()) {
                Some((name, undefined)) => {
                    CompileError::at(code, name, format!("undefined {} `{name}`", undefined.as_str()))
                }
                None => CompileError::at(code, "", "does not compile".into()),
            }
        })?;
        Ok(Self { filter, code: code.to_owned() })
    }

    /// Runs the program on `input` (JSON text) and returns its first output.
    pub fn run(&self, input: &[u8]) -> Result<Output, String> {
        let input = jaq_json::read::parse_single(input).map_err(|e| format!("the input is not JSON: {e}"))?;
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([]));
        let mut outputs = self.filter.id.run((ctx, input)).map(unwrap_valr);
        match outputs.next() {
            None => Ok(Output::Nothing),
            Some(Ok(value)) => Ok(Output::Value(value.to_string())),
            Some(Err(e)) => Err(runtime_error(&e.to_string(), &self.code)),
        }
    }
}

/// A run-time error in words that quote no value: jq's texts embed the values involved
/// ("cannot index {…} with …"), which may be payload fields that redaction hides from some
/// readers, and these texts reach the attempt log and the `/filtered` answer. The kind of
/// error is kept; an `error(…)` the expression raises is shown when it is a literal in the
/// expression (`error("no such customer")`), and otherwise, like a built-in's message,
/// becomes a generic one.
fn runtime_error(text: &str, code: &str) -> String {
    if !text.is_empty() && code.contains(&format!("error({text})")) {
        return text.to_owned();
    }
    if text.starts_with("cannot use ")
        && let Some((_, kind)) = text.rsplit_once(" as ")
        && kind.bytes().all(|b| b.is_ascii_alphabetic() || b" ()".contains(&b))
    {
        return format!("cannot use a value as {kind}");
    }
    let kind = if text.starts_with("cannot index ") {
        "cannot index a value with that key or index (the input has another shape)"
    } else if text.starts_with("cannot calculate ") {
        "cannot calculate with values of these types"
    } else if text.starts_with("invalid path expression") {
        "invalid path expression"
    } else {
        "the expression raised an error (its text is not shown: it may quote payload values)"
    };
    kind.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(code: &str, input: &str) -> String {
        match Program::compile(code).unwrap().run(input.as_bytes()).unwrap() {
            Output::Value(v) => v,
            Output::Nothing => "(nothing)".into(),
        }
    }

    #[test]
    fn runs_jq_with_its_standard_library() {
        assert_eq!(run(".payload.amount > 100", r#"{"payload":{"amount":150}}"#), "true");
        assert_eq!(run("[.items[] | select(.n > 1) | .n] | add", r#"{"items":[{"n":1},{"n":2},{"n":3}]}"#), "5");
        assert_eq!(run(r#".a | ascii_upcase | test("^X")"#, r#"{"a":"xy"}"#), "true");
        assert_eq!(run("empty", "{}"), "(nothing)");
        assert_eq!(run(".[]", "[1,2]"), "1", "only the first output counts");
    }

    #[test]
    fn a_runtime_error_is_reported_not_thrown_and_quotes_no_value() {
        let fails = |code: &str, input: &str| Program::compile(code).unwrap().run(input.as_bytes()).err().unwrap();
        let indexed = fails(".a.b", r#"{"a":"secret-4242"}"#);
        assert!(indexed.starts_with("cannot index a value"), "{indexed}");
        let used = fails(".a[]", r#"{"a":"secret-4242"}"#);
        assert!(used.starts_with("cannot use a value as "), "{used}");
        let calculated = fails(".a - 1", r#"{"a":"secret-4242"}"#);
        assert_eq!(calculated, "cannot calculate with values of these types");
        let raised = fails("error(.a)", r#"{"a":"secret-4242"}"#);
        assert_eq!(fails(r#"error("no such customer")"#, "{}"), r#""no such customer""#, "the expression's own words");
        let parsed = fails(".a | tonumber", r#"{"a":"secret-4242"}"#);
        for text in [indexed, used, calculated, raised, parsed] {
            assert!(!text.contains("4242"), "{text}");
        }
    }

    #[test]
    fn compile_errors_say_where() {
        let e = Program::compile(".a |\n  | .b").err().unwrap();
        assert_eq!((e.line, e.column), (2, 3), "{e}");
        let e = Program::compile(".a | nosuchfunction(1)").err().unwrap();
        assert_eq!((e.line, e.column), (1, 6), "{e}");
        assert!(e.message.contains("nosuchfunction"), "{e}");
        let e = Program::compile(".a | (").err().unwrap();
        assert_eq!(e.line, 1, "{e}");
    }
}
