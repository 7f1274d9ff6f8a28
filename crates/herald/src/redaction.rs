//! Masking sensitive payload fields for readers without the `sensitive` permission (API
//! listings, the dashboard). Two kinds of rules, both from the `redaction` configuration:
//! JSON pointers per event type (`"*"` for every type), and key names matched at any depth
//! (`"click_id"` exactly, `"*payout*"` as a case-insensitive substring). Payloads are never
//! written to logs at all, so logs need no masking.

use std::collections::BTreeMap;

use serde_json::Value;

/// What a masked value reads as.
pub const MASK: &str = "[redacted]";

#[derive(Debug, Clone, Default)]
pub struct Redactor {
    /// Event type (or `*`) → JSON pointers.
    pointers: BTreeMap<String, Vec<String>>,
    keys: Vec<KeyRule>,
}

#[derive(Debug, Clone)]
enum KeyRule {
    Exact(String),
    Contains(String),
}

impl KeyRule {
    fn parse(rule: &str) -> Self {
        match rule.strip_prefix('*').and_then(|r| r.strip_suffix('*')) {
            Some(inner) => Self::Contains(inner.to_ascii_lowercase()),
            None => Self::Exact(rule.to_owned()),
        }
    }

    fn matches(&self, key: &str) -> bool {
        match self {
            Self::Exact(name) => key == name,
            Self::Contains(part) => key.to_ascii_lowercase().contains(part.as_str()),
        }
    }

    /// Text that must occur in a payload for the rule to possibly match.
    fn needle(&self) -> &str {
        match self {
            Self::Exact(name) => name,
            Self::Contains(part) => part,
        }
    }
}

impl Redactor {
    pub fn new(pointers: BTreeMap<String, Vec<String>>, keys: &[String]) -> Self {
        Self { pointers, keys: keys.iter().map(|k| KeyRule::parse(k)).collect() }
    }

    /// The payload (JSON text) as a reader without the permission sees it. Payloads no rule
    /// can touch are returned as they are, without being parsed.
    pub fn mask(&self, event_type: &str, payload: &str) -> Option<String> {
        let pointers: Vec<&String> = ["*", event_type].iter().filter_map(|t| self.pointers.get(*t)).flatten().collect();
        let lowered = payload.to_ascii_lowercase();
        let keys_may_match = self.keys.iter().any(|k| lowered.contains(&k.needle().to_ascii_lowercase()));
        if pointers.is_empty() && !keys_may_match {
            return None;
        }
        let mut value: Value = serde_json::from_str(payload).ok()?;
        let mut changed = false;
        for pointer in pointers {
            if let Some(field) = value.pointer_mut(pointer) {
                *field = Value::String(MASK.into());
                changed = true;
            }
        }
        if keys_may_match {
            changed |= self.mask_keys(&mut value);
        }
        changed.then(|| value.to_string())
    }

    fn mask_keys(&self, value: &mut Value) -> bool {
        let mut changed = false;
        match value {
            Value::Object(map) => {
                for (key, field) in map.iter_mut() {
                    if self.keys.iter().any(|rule| rule.matches(key)) {
                        *field = Value::String(MASK.into());
                        changed = true;
                    } else {
                        changed |= self.mask_keys(field);
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    changed |= self.mask_keys(item);
                }
            }
            _ => {}
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn redactor() -> Redactor {
        let pointers = BTreeMap::from([
            ("*".to_owned(), vec!["/card/number".to_owned()]),
            ("user.created".to_owned(), vec!["/email".to_owned()]),
        ]);
        Redactor::new(pointers, &["click_id".into(), "*payout*".into()])
    }

    fn masked(event_type: &str, payload: Value) -> Value {
        let out = redactor().mask(event_type, &payload.to_string()).expect("something masked");
        serde_json::from_str(&out).unwrap()
    }

    #[test]
    fn pointers_apply_to_their_event_type_and_star_to_all() {
        let payload = json!({"email": "a@b.c", "card": {"number": "4111", "brand": "visa"}});
        let out = masked("user.created", payload.clone());
        assert_eq!(out, json!({"email": MASK, "card": {"number": MASK, "brand": "visa"}}));
        assert_eq!(masked("order.paid", payload)["email"], "a@b.c");
    }

    #[test]
    fn key_rules_match_at_any_depth_and_substrings_ignore_case() {
        let payload = json!({"data": {"click_id": "c1", "Affiliate_Payout_USD": 12, "items": [{"click_id": 3}]},
                             "click_idx": "kept"});
        let out = masked("conversion", payload);
        assert_eq!(out["data"]["click_id"], MASK);
        assert_eq!(out["data"]["Affiliate_Payout_USD"], MASK);
        assert_eq!(out["data"]["items"][0]["click_id"], MASK);
        assert_eq!(out["click_idx"], "kept");
    }

    #[test]
    fn payloads_no_rule_touches_are_left_alone() {
        assert_eq!(redactor().mask("order.paid", r#"{"amount": 5}"#), None);
        assert_eq!(Redactor::default().mask("x", r#"{"click_id": 5}"#), None);
    }
}
