//! Where a request may come from, checked on every listener before authentication (so with
//! `--no-auth` too), against the two ways a web page reaches an API bound to loopback:
//!
//! - **DNS rebinding**: a page on `evil.example` makes its name resolve to 127.0.0.1 and reads
//!   the API as its own origin. Its requests carry `Host: evil.example`, so a `Host` must be the
//!   listener's own address (any IP address when it listens on every interface), `localhost`, or
//!   a name in `AllowedHosts` (ASP.NET Core's setting: `;`-separated names, `*.example.com` for
//!   subdomains, `*` for any); else 400. A request without `Host` (HTTP/1.0) comes from no
//!   browser and passes.
//! - **Cross-site requests**: a page POSTs to `http://127.0.0.1:52323/…` (a `text/plain` form
//!   needs no CORS preflight). As Go's `CrossOriginProtection` does, a request that changes state
//!   (any method but GET, HEAD, OPTIONS) is refused (403) when `Sec-Fetch-Site` says it came
//!   from another origin, or, from browsers without that header, when its `Origin` is not
//!   `scheme://` + its own `Host`. dotnet-monitor's artifact routes (`/dump`, `/trace`, …) start
//!   work on GET, so a GET that `Sec-Fetch-Site` marks `cross-site` or `same-site` is refused
//!   too, except for the web UI's pages (a link to the UI from another site still opens it).
//!   Clients that are not browsers send neither header and pass.

use std::net::IpAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;

/// The host names a listener answers to beyond its own address and `localhost`: names matched
/// without regard to case, `*.example.com` for any subdomain of example.com, `*` for any name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedHosts {
    any: bool,
    names: Vec<String>,
}

/// Why an `AllowedHosts` entry was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllowedHostsError {
    #[error(
        "AllowedHosts entry {0:?} is not a host name: give names without scheme or port, \
         separated by `;`, e.g. `clrscope.example.com;*.svc.cluster.local`, or `*` for any"
    )]
    NotAHostName(String),
}

impl AllowedHosts {
    /// Reads entries as ASP.NET Core writes `AllowedHosts`: each may hold several names separated
    /// by `;`.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<AllowedHosts, AllowedHostsError> {
        let mut hosts = AllowedHosts::default();
        for name in entries.iter().flat_map(|entry| entry.as_ref().split(';')) {
            let name = name.trim().to_ascii_lowercase();
            if name.is_empty() {
                continue;
            }
            if name == "*" {
                hosts.any = true;
                continue;
            }
            let bare = name.strip_prefix("*.").unwrap_or(&name);
            let valid = !bare.is_empty()
                && bare
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if !valid {
                return Err(AllowedHostsError::NotAHostName(name));
            }
            hosts.names.push(name);
        }
        Ok(hosts)
    }

    fn allows(&self, host: &str) -> bool {
        self.any
            || self.names.iter().any(|name| match name.strip_prefix('*') {
                // `*.example.com`: a subdomain, not example.com itself (as ASP.NET Core).
                Some(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
                None => host == name,
            })
    }

    /// The names as configured, for messages.
    fn describe(&self) -> String {
        if self.any {
            "*".into()
        } else {
            self.names.join(";")
        }
    }
}

/// What [`check_request_site`] checks against: the listener's address and the allowed names.
#[derive(Debug)]
pub(crate) struct SiteCheck {
    listen_ip: IpAddr,
    allowed: AllowedHosts,
}

impl SiteCheck {
    pub(crate) fn new(listen_ip: IpAddr, allowed: AllowedHosts) -> SiteCheck {
        SiteCheck { listen_ip, allowed }
    }

    /// Whether `authority` (`host[:port]`, a `Host` header's value) names this listener.
    fn host_allowed(&self, authority: &str) -> bool {
        let Some(host) = host_of(authority) else {
            return false;
        };
        let host = host.to_ascii_lowercase();
        let literal = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(&host);
        if let Ok(ip) = literal.parse::<IpAddr>() {
            // An address cannot be rebound: a browser sends it only when it connects to it.
            return self.listen_ip.is_unspecified() || ip == self.listen_ip;
        }
        host == "localhost" || self.allowed.allows(&host)
    }

    fn allowed_description(&self) -> String {
        let own = if self.listen_ip.is_unspecified() {
            "any IP address".to_string()
        } else {
            self.listen_ip.to_string()
        };
        match self.allowed.describe() {
            names if names.is_empty() => format!("{own} or localhost"),
            names => format!("{own}, localhost or {names}"),
        }
    }
}

/// `host` of `host[:port]` or `[v6][:port]`; None when it does not have that shape.
fn host_of(authority: &str) -> Option<&str> {
    if authority.starts_with('[') {
        let end = authority.find(']')?;
        let rest = &authority[end + 1..];
        let port_ok = rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port);
        return port_ok.then(|| &authority[..=end]);
    }
    match authority.rsplit_once(':') {
        Some((host, port)) if is_port(port) => Some(host),
        Some(_) => None,
        None => Some(authority),
    }
    .filter(|host| !host.is_empty() && !host.contains([':', '/', '@', ' ']))
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
}

/// The middleware over every listener: the `Host` check, then the cross-site check.
pub(crate) async fn check_request_site(
    State(check): State<Arc<SiteCheck>>,
    request: Request,
    next: Next,
) -> Response {
    match refusal(&check, &request) {
        Some(error) => error.into_response(),
        None => next.run(request).await,
    }
}

fn refusal(check: &SiteCheck, request: &Request) -> Option<ApiError> {
    let headers = request.headers();
    let mut hosts = headers.get_all(header::HOST).iter();
    let host_header = hosts.next();
    if hosts.next().is_some() {
        return Some(ApiError::BadRequest("more than one Host header".into()));
    }
    let host_header = match host_header.map(|h| h.to_str()) {
        Some(Ok(host)) => Some(host),
        Some(Err(_)) => return Some(ApiError::BadRequest("the Host header is not text".into())),
        None => None,
    };
    // An absolute request target names the host too; both must be ours.
    let target_host = request.uri().authority().map(|a| a.as_str());
    for host in [host_header, target_host].into_iter().flatten() {
        if !check.host_allowed(host) {
            return Some(ApiError::ForeignHost {
                host: host.to_string(),
                allowed: check.allowed_description(),
            });
        }
    }
    let host = host_header.or(target_host);
    cross_site(request.method(), request.uri().path(), headers, host)
        .map(|reason| ApiError::CrossSite { reason })
}

/// Why a request is a cross-site browser request that may not go through, if it is one.
fn cross_site(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    host: Option<&str>,
) -> Option<String> {
    let fetch_site = headers
        .get("sec-fetch-site")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let from_elsewhere = |site: &str| !matches!(site, "same-origin" | "none");
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return fetch_site
            .filter(|site| from_elsewhere(site) && !crate::web::is_public(path))
            .map(|site| format!("Sec-Fetch-Site: {site}"));
    }
    if let Some(site) = fetch_site {
        return from_elsewhere(&site).then(|| format!("Sec-Fetch-Site: {site}"));
    }
    let origin = headers.get(header::ORIGIN)?;
    let origin = String::from_utf8_lossy(origin.as_bytes()).into_owned();
    let origin_host = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match (origin_host, host) {
        (Some(origin_host), Some(host)) if origin_host.eq_ignore_ascii_case(host) => None,
        _ => Some(format!("Origin: {origin}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(listen: &str, allowed: &[&str]) -> SiteCheck {
        SiteCheck::new(
            listen.parse().unwrap(),
            AllowedHosts::parse(allowed).unwrap(),
        )
    }

    #[test]
    fn hosts_are_the_listen_address_localhost_and_allowed_names() {
        let loopback = check("127.0.0.1", &[]);
        for host in [
            "127.0.0.1:52323",
            "127.0.0.1",
            "localhost:52323",
            "LOCALHOST",
        ] {
            assert!(loopback.host_allowed(host), "{host}");
        }
        for host in [
            "rebind.evil.example",
            "rebind.evil.example:52323",
            "10.0.0.1:52323",
            "[::1]:52323",
            "localhost.evil.example",
            "127.0.0.1:52323@evil",
            "",
            ":80",
        ] {
            assert!(!loopback.host_allowed(host), "{host}");
        }
        let every = check("::", &["clrscope.example.com;*.svc.cluster.local", "other"]);
        for host in [
            "10.0.0.1:52323",
            "[fd00::1]:52323",
            "clrscope.example.com",
            "agent.monitoring.svc.cluster.local:52323",
            "OTHER",
        ] {
            assert!(every.host_allowed(host), "{host}");
        }
        for host in ["svc.cluster.local", "example.com", "[fd00::1"] {
            assert!(!every.host_allowed(host), "{host}");
        }
        assert!(check("127.0.0.1", &["*"]).host_allowed("anything.example"));
    }

    #[test]
    fn allowed_hosts_are_names() {
        for bad in ["http://x", "x:80", "a b", "*."] {
            assert!(AllowedHosts::parse(&[bad]).is_err(), "{bad}");
        }
        assert_eq!(
            AllowedHosts::parse(&[" ; "]).unwrap(),
            AllowedHosts::default()
        );
    }

    #[test]
    fn cross_site_requests_that_change_state_are_refused() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let host = Some("127.0.0.1:52323");
        let post = |pairs| {
            cross_site(
                &Method::POST,
                "/api/v1/processes/1/boost",
                &headers(pairs),
                host,
            )
        };
        assert_eq!(post(&[]), None, "no browser");
        assert_eq!(post(&[("origin", "http://127.0.0.1:52323")]), None);
        assert_eq!(post(&[("sec-fetch-site", "same-origin")]), None);
        assert!(post(&[("origin", "http://evil.example")]).is_some());
        assert!(post(&[("origin", "http://localhost:3000")]).is_some());
        assert!(post(&[("origin", "null")]).is_some());
        assert!(post(&[("sec-fetch-site", "same-site")]).is_some());
        assert!(post(&[
            ("sec-fetch-site", "cross-site"),
            ("origin", "http://127.0.0.1:52323")
        ])
        .is_some());
        let get = |path, pairs| cross_site(&Method::GET, path, &headers(pairs), host);
        assert_eq!(
            get("/dump", &[("origin", "http://evil.example")]),
            None,
            "no Sec-Fetch-Site"
        );
        assert!(get("/dump", &[("sec-fetch-site", "cross-site")]).is_some());
        assert_eq!(get("/", &[("sec-fetch-site", "cross-site")]), None);
        assert_eq!(get("/dump", &[("sec-fetch-site", "none")]), None);
    }
}
