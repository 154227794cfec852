//! A key whose value differs between two job configurations (a resumed
//! run's and the flags given to it).

use serde::Serialize;
use serde_json::Value;

use super::Key;

/// One changed key, with its value before and after (JSON; `null` is unset).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    /// The key.
    pub key: &'static Key,
    /// The value it had.
    pub was: Value,
    /// The value it has now.
    pub now: Value,
}

impl Change {
    pub(crate) fn new<T: Serialize>(key: &'static Key, was: &T, now: &T) -> Self {
        let json = |v: &T| serde_json::to_value(v).expect("every job setting serializes");
        Self {
            key,
            was: json(was),
            now: json(now),
        }
    }

    /// `was` as text for messages (`unset` for an unset key).
    pub fn was_text(&self) -> String {
        show(&self.was)
    }

    /// `now` as text for messages.
    pub fn now_text(&self) -> String {
        show(&self.now)
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::Null => "unset".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}
