//! Refusals of requests that a web page made a browser send: a page the user has open must not
//! write to (or read) the flightlog on the user's machine.
//!
//! Why it exists: a server on loopback without tokens is open to every local process, by
//! design, but a web page is not a local process, though the browser that shows it is. A page
//! may send a "simple" cross-origin request (a `POST` with `Content-Type: text/plain`, or no
//! body) without asking first, and the maintenance routes take an empty body: a page of
//! another site closed every live run as "server restarted" through `sweep-orphans` (an
//! audit's finding). And a page whose own host name resolves to 127.0.0.1 (DNS rebinding) is,
//! to the browser, the same origin as the server: it could read every run and journal.
//!
//! What is refused, `403 forbidden`:
//! - a request whose `Origin` is not the server's own (the scheme's host and port against the
//!   request's `Host`), or is `null` (a sandboxed page, a file): browsers send `Origin` on every
//!   cross-origin request and on every `POST`, other clients do not send it at all;
//! - on a server that listens on loopback only (the only way one starts without
//!   `allow_unauthenticated_non_loopback`), a request whose `Host` is a dotted DNS name other
//!   than a `*.localhost` one, `localhost.localdomain` or `host.docker.internal` (Docker
//!   Desktop's name of the host for its containers): local clients address it by an IP
//!   address, `localhost` or a name of the machine's own (`/etc/hosts`, one label), a
//!   rebinding page by a name of a domain its site controls, which has a dot.
//!
//! Both only on a server without tokens: one with tokens is safe from both without them (a
//! page cannot send a token it does not have), and a page of its own behind a proxy that
//! rewrites `Host` must not be refused.

use axum::http::header::{HOST, ORIGIN};
use axum::http::HeaderMap;

use crate::error::ApiError;

/// Refuse a request a web page made a browser send to a server without tokens (see the
/// module's doc). `loopback_names_only`: it listens on loopback only.
pub(crate) fn check(headers: &HeaderMap, loopback_names_only: bool) -> Result<(), ApiError> {
    let host = headers.get(HOST).and_then(|host| host.to_str().ok());
    if let Some(origin) = headers.get(ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        if !same_origin(origin, host) {
            return Err(ApiError::Forbidden(format!(
                "a web page of {} may not use this server: the request's Origin is not this \
                 server's own (browsers send a page's requests to any address, so a page \
                 could write here); send it from a program, which sends no Origin",
                flightlog_core::json_text::echoed(origin)
            )));
        }
    }
    if loopback_names_only {
        if let Some(host) = host {
            if !is_local_name(host_name(host)) {
                return Err(ApiError::Forbidden(format!(
                    "this server has no tokens and answers only requests that address it by \
                     an IP address, localhost or a name without a dot, not as {}: a web page \
                     can reach a loopback server through a name of its own site that resolves \
                     here (DNS rebinding); address it as 127.0.0.1 or localhost, or configure \
                     a token (--token), or start it with --allow-unauthenticated-non-loopback, \
                     to serve it under other names",
                    flightlog_core::json_text::echoed(host)
                )));
            }
        }
    }
    Ok(())
}

/// Whether `origin` (`scheme://host[:port]`) is the server addressed as `host` (`host[:port]`).
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else {
        return false;
    };
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let (origin_name, origin_port) = split_port(authority);
    let (host_name, host_port) = split_port(host);
    origin_name.eq_ignore_ascii_case(host_name)
        && origin_port.unwrap_or(default_port) == host_port.unwrap_or(default_port)
}

/// `name[:port]` (the name may be a bracketed IPv6 address) as its name and port.
fn split_port(authority: &str) -> (&str, Option<&str>) {
    let port_at = if authority.starts_with('[') {
        authority.find("]:").map(|at| at + 1)
    } else {
        authority.rfind(':')
    };
    match port_at {
        Some(at) => (&authority[..at], Some(&authority[at + 1..])),
        None => (authority, None),
    }
}

/// The name of a `Host` value, without its port.
fn host_name(host: &str) -> &str {
    split_port(host.trim()).0
}

/// An IP address (IPv4, or IPv6 in brackets), a name of one label (`localhost`, a name from
/// `/etc/hosts`: no site on the internet can make one resolve to this machine) or a
/// `*.localhost` name (RFC 6761: resolved to loopback, never by DNS).
fn is_local_name(name: &str) -> bool {
    if let Some(v6) = name
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
    {
        return v6.parse::<std::net::Ipv6Addr>().is_ok();
    }
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    // Digits and dots: an IPv4 address in any of the forms a browser reads as one (`127.1`),
    // never a DNS name a site could make resolve here.
    !name.contains('.')
        || name
            .bytes()
            .all(|byte| byte.is_ascii_digit() || byte == b'.')
        || name.ends_with(".localhost")
        || name == "localhost.localdomain"
        || name == "host.docker.internal"
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(axum::http::HeaderName, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(name.clone(), HeaderValue::from_static(value));
        }
        headers
    }

    #[test]
    fn pages_of_other_origins_and_rebound_names_are_refused() {
        let allowed = [
            headers(&[(HOST, "127.0.0.1:4318")]),
            headers(&[(HOST, "localhost:4318")]),
            headers(&[(HOST, "LOCALHOST.:4318")]),
            headers(&[(HOST, "agent.localhost:4318")]),
            headers(&[(HOST, "[::1]:4318")]),
            headers(&[(HOST, "10.0.0.5")]),
            headers(&[(HOST, "otel-collector:4318")]),
            headers(&[(HOST, "127.1:4318")]),
            headers(&[(HOST, "127.0.0.1.:4318")]),
            headers(&[(HOST, "host.docker.internal:4318")]),
            headers(&[(HOST, "localhost.localdomain")]),
            headers(&[]),
            headers(&[(HOST, "127.0.0.1:4318"), (ORIGIN, "http://127.0.0.1:4318")]),
            headers(&[(HOST, "localhost"), (ORIGIN, "http://LocalHost:80")]),
            headers(&[(HOST, "[::1]:4318"), (ORIGIN, "http://[::1]:4318")]),
            // Behind a proxy that ends TLS: the page's scheme is not the server's.
            headers(&[(HOST, "localhost:4318"), (ORIGIN, "https://localhost:4318")]),
        ];
        for request in &allowed {
            assert!(check(request, true).is_ok(), "{request:?}");
        }
        let refused = [
            headers(&[(HOST, "127.0.0.1:4318"), (ORIGIN, "http://evil.example")]),
            headers(&[(HOST, "127.0.0.1:4318"), (ORIGIN, "http://127.0.0.1:3000")]),
            headers(&[(HOST, "localhost:4318"), (ORIGIN, "null")]),
            headers(&[(ORIGIN, "http://localhost:4318")]),
            headers(&[(HOST, "evil.example:4318")]),
            headers(&[
                (HOST, "evil.example:4318"),
                (ORIGIN, "http://evil.example:4318"),
            ]),
            headers(&[(HOST, "localhost.evil.example")]),
        ];
        for request in &refused {
            assert!(
                matches!(check(request, true), Err(ApiError::Forbidden(_))),
                "{request:?}"
            );
        }
        // Exposed on purpose, any name is served; an Origin still is checked.
        assert!(check(&headers(&[(HOST, "box.lan:4318")]), false).is_ok());
        assert!(check(
            &headers(&[(HOST, "box.lan:4318"), (ORIGIN, "http://box.lan:4318")]),
            false
        )
        .is_ok());
        assert!(check(
            &headers(&[(HOST, "box.lan:4318"), (ORIGIN, "http://evil.example")]),
            false
        )
        .is_err());
    }
}
