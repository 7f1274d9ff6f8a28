//! Field checks shared by the resources, collected into one 422 naming every bad field.

use super::error::{ApiError, ApiResult, ValidationItem};

/// Svix's pattern for uids, event type names and channels: `^[a-zA-Z0-9\-_.]+$`.
pub fn is_slug(value: &str) -> bool {
    !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The id a create call asks for (Herald extension, for imports that keep another server's
/// ids): `parse` accepts the kind's prefix and a plain body; anything else is a 422 at `id`.
/// Without one, `generate` mints Herald's own.
pub fn chosen_id<T>(
    asked: Option<&str>,
    prefix: &str,
    parse: fn(&str) -> Option<T>,
    generate: fn() -> T,
) -> ApiResult<T> {
    let Some(raw) = asked else { return Ok(generate()) };
    parse(raw).ok_or_else(|| {
        let (min, max) = crate::ids::FOREIGN_BODY_LEN.into_inner();
        ApiError::invalid("id", format!("must be {prefix:?} then {min} to {max} letters and digits"))
    })
}

/// A `PUT` naming an existing row may repeat its id, never change it.
pub fn same_id(asked: Option<&str>, current: &str) -> ApiResult<()> {
    match asked {
        Some(asked) if asked != current => {
            Err(ApiError::invalid("id", format!("cannot change: this one is {current}")))
        }
        _ => Ok(()),
    }
}

#[derive(Default)]
pub struct Problems(Vec<ValidationItem>);

impl Problems {
    pub fn push(&mut self, path: &str, msg: impl Into<String>) {
        self.0.push(ValidationItem::body(path, msg));
    }

    pub fn check(&mut self, ok: bool, path: &str, msg: impl Into<String>) {
        if !ok {
            self.push(path, msg);
        }
    }

    /// A slug of at most `max_len` bytes.
    pub fn slug(&mut self, path: &str, value: &str, max_len: usize) {
        self.check(
            is_slug(value) && value.len() <= max_len,
            path,
            format!("must be 1 to {max_len} characters of a-z, A-Z, 0-9, '-', '_' or '.'"),
        );
    }

    /// A uid: a slug that cannot be mistaken for an id of the same kind.
    pub fn uid(&mut self, path: &str, value: &str, id_prefix: &str) {
        self.slug(path, value, 256);
        self.check(
            !value.starts_with(id_prefix),
            path,
            format!("must not start with {id_prefix:?} (reserved for ids)"),
        );
    }

    /// A list of slugs with bounds on its length.
    pub fn slug_list(&mut self, path: &str, items: &[String], max_len: usize, max_items: usize) {
        self.check(!items.is_empty(), path, "must not be empty (omit it or use null for no filter)");
        self.check(items.len() <= max_items, path, format!("must have at most {max_items} items"));
        let mut seen = std::collections::HashSet::new();
        for (i, item) in items.iter().enumerate() {
            self.slug(&format!("{path}.{i}"), item, max_len);
            self.check(seen.insert(item), &format!("{path}.{i}"), "duplicate item");
        }
    }

    pub fn finish(self) -> ApiResult<()> {
        if self.0.is_empty() { Ok(()) } else { Err(ApiError::Validation(self.0)) }
    }
}

/// Deserializes a field that distinguishes "absent" (`None`) from "null" (`Some(None)`),
/// as PATCH bodies need.
pub fn double_option<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    serde::Deserialize::deserialize(de).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_follow_the_svix_pattern() {
        assert!(is_slug("user.signup-v2_x"));
        assert!(!is_slug(""));
        assert!(!is_slug("a b"));
        assert!(!is_slug("ü"));
        assert!(!is_slug("a/b"));
    }

    #[test]
    fn every_problem_is_reported_with_its_path() {
        let mut p = Problems::default();
        p.slug_list("channels", &["ok".into(), "not ok".into(), "ok".into()], 128, 10);
        p.uid("uid", "app_123", "app_");
        let Err(ApiError::Validation(items)) = p.finish() else { panic!("expected problems") };
        let locs: Vec<String> = items.iter().map(|i| i.loc.join(".")).collect();
        assert_eq!(locs, vec!["body.channels.1", "body.channels.2", "body.uid"]);
    }
}
