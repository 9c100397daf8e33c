//! `docs/openapi.json` against the routes the agent really serves, both ways:
//!
//! - every route the code registers (each `.route("PATH", get(..).post(..))` in the workspace's
//!   sources) is documented with exactly its methods, and every documented one is registered, so a
//!   route added without documentation fails here;
//! - a real agent answers every documented path and method with something other than the router's
//!   own "no route" 404 or 405, and answers 405 to every other method on those paths.

use crate::support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::agent::{data_dir, Agent};
use support::openapi::concrete;

/// Methods a route can be registered with (HEAD comes with GET in axum).
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// path → methods, as `docs/openapi.json` documents them.
fn documented() -> BTreeMap<String, BTreeSet<String>> {
    let doc = support::openapi::document();
    assert!(
        doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")),
        "not an OpenAPI 3 document"
    );
    let paths = doc["paths"].as_object().expect("paths");
    paths
        .iter()
        .map(|(path, item)| {
            let methods = item
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| METHODS.contains(&k.to_ascii_uppercase().as_str()))
                .map(|k| k.to_ascii_uppercase())
                .collect();
            (path.clone(), methods)
        })
        .collect()
}

/// The workspace's Rust sources outside tests: `src/` of the root package and of each member.
fn sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs")
                && path.file_name().is_some_and(|n| n != "tests.rs")
            {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root()).unwrap().flatten() {
        let dir = entry.path();
        if dir.join("Cargo.toml").exists() || dir.ends_with("src") {
            let src = if dir.ends_with("src") {
                dir
            } else {
                dir.join("src")
            };
            walk(&src, &mut files);
        }
    }
    files
}

/// The text of the call starting at `open` (just after its `(`) up to its matching `)`.
fn call_arguments(text: &str, open: usize) -> Option<&str> {
    let mut depth = 1;
    let mut in_string = false;
    let mut escaped = false;
    for (i, c) in text[open..].char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_string => escaped = true,
            '"' => in_string = !in_string,
            '(' if !in_string => depth += 1,
            ')' if !in_string => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open..open + i]);
                }
            }
            _ => {}
        }
    }
    None
}

/// `"literal"`, or a `const NAME: &str = "literal";` of the same file.
fn route_path(argument: &str, file_text: &str) -> Option<String> {
    let argument = argument.trim();
    if let Some(literal) = argument.strip_prefix('"') {
        return literal.strip_suffix('"').map(str::to_string);
    }
    let declaration = format!("const {argument}: &str = \"");
    let start = file_text.find(&declaration)? + declaration.len();
    let end = file_text[start..].find('"')?;
    Some(file_text[start..start + end].to_string())
}

/// The methods of a method router expression: `get(a)`, `post(a).delete(b)`, `routing::get(a)`.
fn router_methods(expression: &str) -> BTreeSet<String> {
    let mut methods = BTreeSet::new();
    for method in METHODS {
        let name = method.to_ascii_lowercase();
        let mut rest = expression;
        while let Some(at) = rest.find(&format!("{name}(")) {
            let before = rest[..at].chars().next_back();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                methods.insert(method.to_string());
            }
            rest = &rest[at + name.len()..];
        }
    }
    methods
}

/// path → methods, as the code registers them with axum's `Router::route`.
fn registered() -> BTreeMap<String, BTreeSet<String>> {
    let mut routes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in sources() {
        let text = std::fs::read_to_string(&file).unwrap();
        // unit tests may build routers of their own
        let text = text.split("#[cfg(test)]").next().unwrap();
        for marker in [".nest(", ".nest_service(", ".route_service("] {
            assert!(
                !text.contains(marker),
                "{}: {marker} is not understood by this test; extend tests/openapi.rs",
                file.display()
            );
        }
        for (at, _) in text.match_indices(".route(") {
            let arguments = call_arguments(text, at + ".route(".len())
                .unwrap_or_else(|| panic!("{}: unbalanced .route(", file.display()));
            let (path, expression) = arguments
                .split_once(',')
                .unwrap_or_else(|| panic!("{}: .route({arguments})", file.display()));
            let path = route_path(path, text).unwrap_or_else(|| {
                panic!(
                    "{}: route path {path:?} is neither a literal nor a const &str of the file",
                    file.display()
                )
            });
            let methods = router_methods(expression);
            assert!(
                !methods.is_empty(),
                "{}: no method in the router of {path}: {expression}",
                file.display()
            );
            routes.entry(path).or_default().extend(methods);
        }
    }
    routes
}

#[test]
fn the_document_lists_exactly_the_registered_routes() {
    let documented = documented();
    let registered = registered();
    assert!(
        registered.contains_key("/api/v1/profile"),
        "the source scan found no routes: {registered:?}"
    );
    let mut problems = Vec::new();
    for (path, methods) in &registered {
        match documented.get(path) {
            None => problems.push(format!("{path} ({methods:?}) is served but not documented")),
            Some(doc) if doc != methods => problems.push(format!(
                "{path}: served with {methods:?}, documented with {doc:?}"
            )),
            Some(_) => {}
        }
    }
    for (path, methods) in &documented {
        if !registered.contains_key(path) {
            problems.push(format!(
                "{path} ({methods:?}) is documented but no code registers it"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/openapi.json and the router disagree:\n{}",
        problems.join("\n")
    );
}

#[test]
fn a_real_agent_serves_every_documented_route_and_refuses_other_methods() {
    let dir = data_dir("openapi");
    std::fs::create_dir_all(&dir).unwrap();
    // Listen mode only: the agent attaches to nothing, it only has to route.
    let socket = dir.join("diag.sock");
    let agent = Agent::start(
        &dir.join("data"),
        &[
            "--no-connect",
            "--diagnostic-port",
            socket.to_str().unwrap(),
        ],
    );
    let doc = support::openapi::document();
    let mut problems = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let url = concrete(path, item);
        let documented: Vec<String> = item
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.to_ascii_uppercase())
            .filter(|k| METHODS.contains(&k.as_str()))
            .collect();
        for method in METHODS {
            // With the agent's token: authentication is tests/auth.rs's subject.
            let response = agent.request(method, &url);
            let problem_type = serde_json::from_str::<Value>(&response.body)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_string))
                .unwrap_or_default();
            let unrouted = (response.status == 404 && problem_type.ends_with(":not-found"))
                || response.status == 405;
            if documented.iter().any(|m| m == method) {
                if unrouted {
                    problems.push(format!(
                        "{method} {url} is documented but answers {}: {}",
                        response.status, response.body
                    ));
                }
            } else if response.status != 405 {
                problems.push(format!(
                    "{method} {url} is not documented but answers {}",
                    response.status
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
