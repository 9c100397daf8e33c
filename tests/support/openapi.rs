//! `docs/openapi.json`, the list of the agent's routes that `tests/openapi.rs` keeps equal to
//! the router, for tests that walk every route.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// The parsed document.
pub fn document() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/openapi.json");
    let text = std::fs::read_to_string(path).expect("docs/openapi.json");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

/// A documented path with its parameters filled in from their examples (else `1`), and the
/// examples of the query parameters its operations declare themselves (so that, say, the
/// self-profile samples for 1 s rather than its default 30).
pub fn concrete(path: &str, item: &Value) -> String {
    let parameters: Vec<Value> = item
        .as_object()
        .unwrap()
        .values()
        .flat_map(|v| {
            v.as_array()
                .cloned()
                .or_else(|| v["parameters"].as_array().cloned())
                .unwrap_or_default()
        })
        .collect();
    let example = |p: &Value| match &p["example"] {
        Value::String(s) => s.clone(),
        Value::Null => "1".to_string(),
        other => other.to_string(),
    };
    let in_path: BTreeMap<String, String> = parameters
        .iter()
        .filter(|p| p["in"] == "path")
        .map(|p| (p["name"].as_str().unwrap().to_string(), example(p)))
        .collect();
    let mut out = path.to_string();
    for (name, value) in in_path {
        out = out.replace(&format!("{{{name}}}"), &value);
    }
    assert!(
        !out.contains('{'),
        "{path}: a path parameter has no example"
    );
    let query: BTreeMap<String, String> = parameters
        .iter()
        .filter(|p| p["in"] == "query" && !p["example"].is_null())
        .map(|p| (p["name"].as_str().unwrap().to_string(), example(p)))
        .collect();
    let query: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !query.is_empty() {
        out.push('?');
        out.push_str(&query.join("&"));
    }
    out
}

/// Whether an operation needs no token (`"security": []`: the web UI's files).
pub fn is_public(operation: &Value) -> bool {
    operation["security"]
        .as_array()
        .is_some_and(|s| s.is_empty())
}
