//! What an import does with one object: the fields it copies, read the same way from both
//! servers (they speak the same API), the body that creates the object on the destination,
//! or the fields that differ from what the destination holds.

use serde_json::{Map, Value};

/// How a field is read, so that equal settings compare equal whatever form a server
/// answers them in.
#[derive(Clone, Copy)]
enum Shape {
    /// A string; absent is "".
    Text,
    /// A boolean; absent is false.
    Flag,
    /// An object; absent is {}.
    Object,
    /// A URL in its normal form (Svix and Herald store it so; older rows may not be).
    Url,
    /// A list of names; an empty one is none (Herald refuses empty lists).
    List,
    /// Anything, compared as given; absent is null.
    Plain,
}

/// A field as the API names it on writes, and the names it may be read under (Svix answers
/// some under a deprecated name as well).
struct Field {
    name: &'static str,
    reads: &'static [&'static str],
    shape: Shape,
}

const fn field(name: &'static str, reads: &'static [&'static str], shape: Shape) -> Field {
    Field { name, reads, shape }
}

const EVENT_TYPE: &[Field] = &[
    field("description", &["description"], Shape::Text),
    field("archived", &["archived"], Shape::Flag),
    field("deprecated", &["deprecated"], Shape::Flag),
    field("schemas", &["schemas"], Shape::Plain),
    field("featureFlag", &["featureFlag"], Shape::Plain),
];

const APPLICATION: &[Field] = &[
    field("uid", &["uid"], Shape::Plain),
    field("name", &["name"], Shape::Text),
    field("metadata", &["metadata"], Shape::Object),
    field("throttleRate", &["throttleRate", "rateLimit"], Shape::Plain),
];

const ENDPOINT: &[Field] = &[
    field("uid", &["uid"], Shape::Plain),
    field("url", &["url"], Shape::Url),
    field("description", &["description"], Shape::Text),
    field("disabled", &["disabled"], Shape::Flag),
    field("filterTypes", &["filterTypes", "eventTypes"], Shape::List),
    field("channels", &["channels"], Shape::List),
    field("metadata", &["metadata"], Shape::Object),
    field("throttleRate", &["throttleRate", "rateLimit"], Shape::Plain),
    field("version", &["version"], Shape::Plain),
];

fn read(field: &Field, object: &Value) -> Value {
    let raw = field.reads.iter().find_map(|name| object.get(*name).filter(|v| !v.is_null())).cloned();
    match (field.shape, raw) {
        (Shape::Text, None) => Value::String(String::new()),
        (Shape::Flag, raw) => Value::Bool(raw.and_then(|v| v.as_bool()).unwrap_or(false)),
        (Shape::Object, None) => Value::Object(Map::new()),
        (Shape::Url, Some(Value::String(text))) => Value::String(url::Url::parse(&text).map_or(text, String::from)),
        (Shape::List, Some(Value::Array(items))) if items.is_empty() => Value::Null,
        (_, raw) => raw.unwrap_or(Value::Null),
    }
}

/// What the import does with one object.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Create it with this body.
    Create(Value),
    /// Change these fields (a PATCH body holding only them).
    Update(Value),
    Unchanged,
}

impl Step {
    /// The fields an update changes.
    pub fn changed(&self) -> Vec<String> {
        match self {
            Self::Update(Value::Object(fields)) => fields.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

/// The step that makes `current` (the destination's object, if any) hold `source`'s
/// `fields`; a creation's body starts from `identity` (the id or name it is created under).
fn step(fields: &[Field], source: &Value, current: Option<&Value>, identity: Map<String, Value>) -> Step {
    let wanted = fields.iter().map(|f| (f.name, read(f, source)));
    match current {
        None => {
            let mut body = identity;
            // A null is left out of a creation: it is the default, and Herald refuses
            // some (an empty filter list) where it means nothing.
            body.extend(wanted.filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.to_owned(), v)));
            Step::Create(Value::Object(body))
        }
        Some(current) => {
            let changes: Map<String, Value> = fields
                .iter()
                .zip(wanted)
                .filter(|(f, (_, v))| read(f, current) != *v)
                .map(|(_, (k, v))| (k.to_owned(), v))
                .collect();
            if changes.is_empty() { Step::Unchanged } else { Step::Update(Value::Object(changes)) }
        }
    }
}

fn identity(key: &str, value: &Value) -> Map<String, Value> {
    Map::from_iter([(key.to_owned(), value.clone())])
}

pub fn event_type(source: &Value, current: Option<&Value>) -> Step {
    step(EVENT_TYPE, source, current, identity("name", &source["name"]))
}

pub fn application(source: &Value, current: Option<&Value>) -> Step {
    step(APPLICATION, source, current, identity("id", &source["id"]))
}

/// An endpoint's fields besides its secret and headers (`secrets` and `headers` below).
pub fn endpoint(source: &Value, current: Option<&Value>) -> Step {
    step(ENDPOINT, source, current, identity("id", &source["id"]))
}

/// An endpoint's signing secrets as `GET …/secret` shows them: the current one, and (a
/// Herald source, to its admin token) the earlier ones still signing, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Secrets {
    pub current: String,
    /// `(key, seconds it still signs)`.
    pub previous: Vec<(String, u64)>,
}

impl Secrets {
    pub fn read(answer: &Value, now: chrono::DateTime<chrono::Utc>) -> Option<Self> {
        let current = answer["key"].as_str()?.to_owned();
        let previous = answer["previousKeys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                let ends = chrono::DateTime::parse_from_rfc3339(p["expiresAt"].as_str()?).ok()?;
                let left = (ends.with_timezone(&chrono::Utc) - now).num_seconds();
                Some((p["key"].as_str()?.to_owned(), u64::try_from(left).ok().filter(|s| *s > 0)?))
            })
            .collect();
        Some(Self { current, previous })
    }

    /// The key an endpoint is created with, then the rotations that bring it to the
    /// current key with each earlier one signing as long as it still does at the source:
    /// `(new key, seconds the key it replaces keeps signing)`.
    pub fn creation(&self) -> (String, Vec<(String, u64)>) {
        let mut keys = self.previous.iter().map(|(key, _)| key.clone()).chain([self.current.clone()]);
        let first = keys.next().expect("the current key is always there");
        let rotations = keys.zip(self.previous.iter().map(|(_, left)| *left)).collect();
        (first, rotations)
    }
}

/// An endpoint's own headers as `GET …/headers` shows them: the values of those that are
/// not sensitive, and the names of those that are (their values are never shown).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headers {
    pub values: Map<String, Value>,
    pub sensitive: Vec<String>,
}

impl Headers {
    pub fn read(answer: &Value) -> Self {
        let values = answer["headers"].as_object().cloned().unwrap_or_default();
        let sensitive = answer["sensitive"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect();
        Self { values, sensitive }
    }

    /// The PATCH body that gives `current` these values (`null` removes a header the
    /// source does not have), if anything differs. Sensitive headers are left alone.
    pub fn patch_over(&self, current: &Headers) -> Option<Value> {
        let mut patch: Map<String, Value> = self
            .values
            .iter()
            .filter(|(name, value)| current.values.get(*name) != Some(value))
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        for name in current.values.keys().filter(|name| !self.values.contains_key(*name)) {
            patch.insert(name.clone(), Value::Null);
        }
        (!patch.is_empty()).then(|| serde_json::json!({ "headers": patch }))
    }

    /// The sensitive headers of the source that `current` does not have at all.
    pub fn missing_in(&self, current: &Headers) -> Vec<String> {
        let has = |name: &String| {
            let name = name.to_ascii_lowercase();
            current.values.keys().chain(&current.sensitive).any(|n| n.to_ascii_lowercase() == name)
        };
        self.sensitive.iter().filter(|name| !has(name)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_missing_object_is_created_with_what_is_set() {
        let source = json!({"id": "app_1", "uid": null, "name": "Acme", "metadata": {"tier": "gold"}, "rateLimit": 5});
        let Step::Create(body) = application(&source, None) else { panic!() };
        assert_eq!(body, json!({"id": "app_1", "name": "Acme", "metadata": {"tier": "gold"}, "throttleRate": 5}));
    }

    #[test]
    fn equal_settings_in_other_forms_are_unchanged() {
        let source = json!({"id": "ep_1", "url": "https://h.example", "filterTypes": [], "rateLimit": 3, "version": 1});
        let current = json!({"id": "ep_1", "url": "https://h.example/", "description": "", "filterTypes": null,
            "channels": null, "metadata": {}, "throttleRate": 3, "disabled": false, "version": 1});
        assert_eq!(endpoint(&source, Some(&current)), Step::Unchanged);
    }

    #[test]
    fn an_update_names_only_what_differs_and_nulls_what_went() {
        let source = json!({"name": "T", "description": "new", "schemas": null, "archived": true});
        let current = json!({"name": "T", "description": "old", "schemas": {"1": {}}, "archived": true});
        let changed = event_type(&source, Some(&current));
        assert_eq!(changed, Step::Update(json!({"description": "new", "schemas": null})));
        assert_eq!(changed.changed(), ["description", "schemas"]);
    }

    #[test]
    fn earlier_keys_are_created_first_and_each_keeps_its_time() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc();
        let answer = json!({"key": "whsec_c", "previousKeys": [
            {"key": "whsec_a", "expiresAt": "2026-01-01T00:01:40Z"},
            {"key": "whsec_b", "expiresAt": "2026-01-01T01:00:00Z"},
            {"key": "whsec_gone", "expiresAt": "2025-12-31T23:00:00Z"}]});
        let secrets = Secrets::read(&answer, now).unwrap();
        assert_eq!(secrets.creation(), ("whsec_a".into(), vec![("whsec_b".into(), 100), ("whsec_c".into(), 3600)]));
        let plain = Secrets::read(&json!({"key": "whsec_c"}), now).unwrap();
        assert_eq!(plain.creation(), ("whsec_c".into(), vec![]));
    }

    #[test]
    fn headers_are_patched_to_the_sources_and_sensitive_ones_are_named() {
        let source = Headers::read(&json!({"headers": {"X-Team": "a", "X-New": "n"}, "sensitive": ["Authorization"]}));
        let current = Headers::read(&json!({"headers": {"X-Team": "b", "X-Old": "o"}, "sensitive": []}));
        assert_eq!(source.patch_over(&current), Some(json!({"headers": {"X-Team": "a", "X-New": "n", "X-Old": null}})));
        assert_eq!(source.patch_over(&source), None);
        assert_eq!(source.missing_in(&current), ["Authorization"]);
        let set_by_hand = Headers::read(&json!({"headers": {}, "sensitive": ["authorization"]}));
        assert!(source.missing_in(&set_by_hand).is_empty());
    }
}
