//! The web UI: hand-written HTML, CSS and JavaScript modules under `ui/web/`, compiled into the
//! binary so that the agent serves them offline, with no build step and no CDN.
//!
//! | route | answer |
//! |---|---|
//! | `GET /` | `web/index.html` |
//! | `GET /ui/{file}` | `web/{file}`: the page's modules and style sheet |
//!
//! The page holds no data: it asks the API for everything with the token the user typed (when
//! auth is on), so these routes stay outside authentication.

use axum::extract::Path;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;
use crate::server::ApiState;

/// `(file name, contents)` of every file under `web/`, each embedded with `include_str!`.
macro_rules! assets {
    ($($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../web/", $file)))),*]
    };
}

/// The files of the web UI; a unit test checks this is exactly what `web/` holds.
const ASSETS: &[(&str, &str)] = assets![
    "index.html",
    "style.css",
    "main.js",
    "api.js",
    "auth.js",
    "state.js",
    "format.js",
    "dom.js",
    "filters.js",
    "timeline.js",
    "tree.js",
    "flamegraph.js",
    "toptable.js",
    "profileview.js",
    "compare.js",
    "export.js",
    "processes.js",
    "signals.js",
    "incidents.js",
];

/// Scripts and styles only from the agent itself, no plug-ins, no framing: the page shows
/// function names from the profiled processes and must never run anything they contain.
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether `path` is one of the web UI's files, which [`crate::auth`] serves without a token.
pub(crate) fn is_public(path: &str) -> bool {
    path == "/"
        || path
            .strip_prefix("/ui/")
            .is_some_and(|file| !file.contains('/'))
}

pub fn web_routes() -> Router<ApiState> {
    Router::new()
        .route("/", get(index))
        .route("/ui/{file}", get(asset))
}

async fn index() -> Response {
    let mut response = serve("index.html").unwrap_or_else(IntoResponse::into_response);
    response.headers_mut().insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    response
}

async fn asset(Path(file): Path<String>) -> Result<Response, ApiError> {
    serve(&file)
}

fn serve(file: &str) -> Result<Response, ApiError> {
    let (name, body) = ASSETS
        .iter()
        .find(|(name, _)| *name == file)
        .ok_or_else(|| ApiError::NotFound {
            method: "GET".into(),
            path: format!("/ui/{file}"),
        })?;
    let content_type = match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        _ => "text/javascript; charset=utf-8",
    };
    Ok((
        [
            (header::CONTENT_TYPE, content_type),
            // The files change with the binary: a browser asks again instead of running an old
            // page against a new API.
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        *body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn web_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web")
    }

    #[test]
    fn every_file_of_the_web_folder_is_embedded() {
        let on_disk: BTreeSet<String> = std::fs::read_dir(web_dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let embedded: BTreeSet<String> = ASSETS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(on_disk, embedded);
    }

    /// Every `'./x.js'` a module imports and every `"/ui/…"` the page loads is served.
    #[test]
    fn every_reference_resolves_to_an_embedded_file() {
        let served = |name: &str| ASSETS.iter().any(|(n, _)| *n == name);
        let mut references = 0;
        for (name, body) in ASSETS {
            for quote in ['\'', '"'] {
                for prefix in ["./", "/ui/"] {
                    let opening = format!("{quote}{prefix}");
                    for (at, _) in body.match_indices(&opening) {
                        let rest = &body[at + opening.len()..];
                        let target = &rest[..rest.find(quote).unwrap()];
                        assert!(
                            served(target),
                            "{name} refers to {prefix}{target}, not embedded"
                        );
                        references += 1;
                    }
                }
            }
        }
        // index.html loads the style sheet and main.js, which imports the rest.
        assert!(references >= ASSETS.len() - 1, "{references} references");
    }
}
