//! How two documents differ: what a check reports and `pipelines explain` shows.

use serde_json::{Map, Value};

/// The names of the top-level fields whose values differ between `a` and `b` (present in
/// one only, or with different values), sorted.
pub fn differing_fields(a: &Map<String, Value>, b: &Map<String, Value>) -> Vec<String> {
    let mut names: Vec<String> = a
        .iter()
        .filter(|(k, v)| b.get(*k) != Some(v))
        .map(|(k, _)| k.clone())
        .chain(b.keys().filter(|k| !a.contains_key(*k)).cloned())
        .collect();
    names.sort();
    names.dedup();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn fields_differ_by_value_or_by_presence_on_either_side() {
        let a = json!({"id": 1, "name": "a", "only_a": true, "same": [1]});
        let b = json!({"id": 1, "name": "b", "only_b": null, "same": [1]});
        let names = differing_fields(a.as_object().unwrap(), b.as_object().unwrap());
        assert_eq!(names, ["name", "only_a", "only_b"]);
        assert!(differing_fields(a.as_object().unwrap(), a.as_object().unwrap()).is_empty());
    }
}
