//! Bearer-token auth: which token may do what, checked before any handler runs.
//!
//! With no token configured the server is open (and `flightlog serve` refuses to listen on a
//! non-loopback address then, unless told to on purpose). With at least one, every request but
//! `GET /healthz` needs `Authorization: Bearer <token>`: no header, a malformed one or an unknown
//! token is `401 unauthorized`; a known token without the route's scope is `403 forbidden`.
//!
//! The scope a request needs is derived from its method and its route template, not from a
//! per-route list: reads (`GET`, `HEAD`) need `read`, every other method needs `ingest`, and the
//! few maintenance routes of [`ADMIN_ROUTES`] need `admin` whatever the method. So a route added
//! later (OTLP ingest, metrics, the web UI) gets the contract's scope without anyone remembering
//! to list it; only a new *maintenance* route has to be added to [`ADMIN_ROUTES`]. A path no
//! route serves needs any valid token (it then gets its 404), so probing without a token learns
//! nothing about which paths exist; so does a method its route does not serve (its 405).
//!
//! Several OpenTelemetry SDKs make a Basic header easier to set than a Bearer one, so a token
//! is also accepted as the password of `Authorization: Basic base64(user:token)` (the user
//! name is ignored); the gRPC listener takes the same two forms from its metadata.
//!
//! Tokens are kept only as SHA-256 digests. A presented token is hashed and compared with every
//! configured digest in constant time without stopping at the first match, so neither the
//! response time nor its variation tells how much of a guess was right, or how long the real
//! tokens are.

use std::fmt;

use axum::extract::Request;
use axum::http::{header, HeaderMap, Method};
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::prelude::Engine as _;

/// Standard base64 with its `=` padding optional: RFC 7617 asks for it, but some clients and
/// hand-made headers leave it out, and the credentials are as clear either way.
const BASIC_CREDENTIALS: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use crate::error::ApiError;
use crate::state::AppState;

/// What a token may do. Scopes are independent: `admin` does not imply `read` or `ingest`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    /// Every read: all `GET`s, including the live streams.
    Read,
    /// Every write: span writes, the batch, journal appends, OTLP ingest.
    Ingest,
    /// Maintenance: the orphan and stale sweeps, activity prune, journal compact and prune, and
    /// the testing clock.
    Admin,
}

impl Scope {
    /// Every scope, in the order help texts list them.
    pub const ALL: [Scope; 3] = [Scope::Read, Scope::Ingest, Scope::Admin];

    /// The scope's name in settings and messages.
    pub fn name(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Ingest => "ingest",
            Scope::Admin => "admin",
        }
    }

    /// The scope named `text` (exactly one of `read`, `ingest`, `admin`, any case).
    pub fn parse(text: &str) -> Option<Scope> {
        Scope::ALL
            .into_iter()
            .find(|scope| scope.name().eq_ignore_ascii_case(text.trim()))
    }

    fn bit(self) -> u8 {
        match self {
            Scope::Read => 1,
            Scope::Ingest => 2,
            Scope::Admin => 4,
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Scope`]s.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    /// No scope at all.
    pub const NONE: Scopes = Scopes(0);
    /// Every scope (what a `--token` flag grants).
    pub const ALL: Scopes = Scopes(1 | 2 | 4);

    /// This set plus `scope`.
    #[must_use]
    pub fn with(self, scope: Scope) -> Scopes {
        Scopes(self.0 | scope.bit())
    }

    /// Whether `scope` is in the set.
    pub fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The scopes in the set, in [`Scope::ALL`] order.
    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL
            .into_iter()
            .filter(move |scope| self.contains(*scope))
    }
}

impl FromIterator<Scope> for Scopes {
    fn from_iter<I: IntoIterator<Item = Scope>>(iter: I) -> Self {
        iter.into_iter().fold(Scopes::NONE, Scopes::with)
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter().map(Scope::name)).finish()
    }
}

/// Why a token cannot be configured. The messages never repeat the token itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The token is the empty string.
    #[error("a token must not be empty")]
    Empty,
    /// The token holds a space, a control character or non-ASCII text, which an
    /// `Authorization` header cannot carry unambiguously.
    #[error("a token may hold only visible ASCII characters (no spaces, no control characters)")]
    NotVisibleAscii,
    /// The token was given no scope, so it could do nothing.
    #[error("a token needs at least one scope (read, ingest, admin)")]
    NoScopes,
    /// The same secret was configured before: silently merging the two entries' scopes would
    /// let a copy-paste slip grant more than either entry says.
    #[error(
        "this token is configured twice: give each token once, with all its scopes in that one \
         entry"
    )]
    Duplicate,
}

/// One configured token: the SHA-256 digest of its secret and its scopes. Its `Debug` shows the
/// scopes only.
#[derive(Clone, PartialEq, Eq)]
struct Token {
    digest: [u8; 32],
    scopes: Scopes,
    /// Shorter than [`SHORT_TOKEN_BYTES`]: guessable, worth a warning at start.
    short: bool,
}

/// Tokens shorter than this are accepted, but `serve` warns about them: 16 random characters
/// are the least that resists guessing over the network.
pub const SHORT_TOKEN_BYTES: usize = 16;

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token")
            .field("secret", &"<redacted>")
            .field("scopes", &self.scopes)
            .finish()
    }
}

fn digest(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// The configured tokens. Empty (the default) means auth is off.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthConfig {
    tokens: Vec<Token>,
}

impl AuthConfig {
    /// No tokens: every request is allowed.
    pub fn open() -> Self {
        Self::default()
    }

    /// Add a token with `scopes`; a secret already configured is refused
    /// ([`TokenError::Duplicate`]).
    pub fn add_token(&mut self, secret: &str, scopes: Scopes) -> Result<(), TokenError> {
        check_token_text(secret)?;
        if scopes.is_empty() {
            return Err(TokenError::NoScopes);
        }
        let digest = digest(secret.as_bytes());
        if self.tokens.iter().any(|token| token.digest == digest) {
            return Err(TokenError::Duplicate);
        }
        self.tokens.push(Token {
            digest,
            scopes,
            short: secret.len() < SHORT_TOKEN_BYTES,
        });
        Ok(())
    }

    /// The same configuration plus a token (see [`AuthConfig::add_token`]).
    pub fn with_token(mut self, secret: &str, scopes: Scopes) -> Result<Self, TokenError> {
        self.add_token(secret, scopes)?;
        Ok(self)
    }

    /// Whether any token is configured, i.e. whether requests need one.
    pub fn is_enabled(&self) -> bool {
        !self.tokens.is_empty()
    }

    /// How many distinct tokens are configured.
    pub fn token_count(&self) -> usize {
        self.tokens.len()
    }

    /// How many of them are shorter than [`SHORT_TOKEN_BYTES`].
    pub fn short_token_count(&self) -> usize {
        self.tokens.iter().filter(|token| token.short).count()
    }

    /// The scopes of `presented`, or `None` when it is no configured token.
    ///
    /// Constant time in the presented token's content: every configured digest is compared,
    /// whole, whatever matched before.
    pub fn scopes_of(&self, presented: &str) -> Option<Scopes> {
        let presented = digest(presented.as_bytes());
        let mut found = Choice::from(0);
        let mut scopes = 0u8;
        for token in &self.tokens {
            let matches = token.digest.ct_eq(&presented);
            found |= matches;
            // Branch-free: keep the scope bits only where the digest matched.
            scopes |= token.scopes.0 & 0u8.wrapping_sub(matches.unwrap_u8());
        }
        bool::from(found).then_some(Scopes(scopes))
    }
}

/// Refuse token text an `Authorization: Bearer` header cannot carry.
pub fn check_token_text(secret: &str) -> Result<(), TokenError> {
    if secret.is_empty() {
        return Err(TokenError::Empty);
    }
    if !secret.bytes().all(|byte| byte.is_ascii_graphic()) {
        return Err(TokenError::NotVisibleAscii);
    }
    Ok(())
}

/// Route templates (as registered with the router) that need `admin` whatever their method.
/// A new maintenance route must be added here; every other route's scope follows its method.
pub const ADMIN_ROUTES: &[&str] = &[
    "/v1/activity/maintenance/sweep-orphans",
    "/v1/activity/maintenance/sweep-stale",
    "/v1/activity/maintenance/prune",
    "/v1/engagements/prune",
    "/v1/engagements/{engagementId}/compact",
    "/v1/testing/clock",
];

/// What a request needs to be let through when auth is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Nothing: `GET /healthz` (and `HEAD`, its body-less twin).
    Public,
    /// Any configured token: a path no route serves (the answer is its 404), or a method its
    /// route does not serve (its 405).
    AnyToken,
    /// A token holding this scope.
    Scope(Scope),
}

/// Whether `method` only reads (`GET`, `HEAD`).
pub fn is_read_method(method: &Method) -> bool {
    method == Method::GET || method == Method::HEAD
}

/// What a request with `method` to `path` needs; `route` is the template of the route that
/// matched it (`None` for a path no route serves).
pub fn required_access(method: &Method, path: &str, route: Option<&str>) -> Access {
    if is_read_method(method) && path == "/healthz" {
        return Access::Public;
    }
    // No route serves OPTIONS (or TRACE, CONNECT): any token gets the router's 405. Taken as
    // a write, its answer depended on the token's scope (403 with a read token, 405 with an
    // ingest one: an audit's finding).
    let Some(route) =
        route.filter(|_| !matches!(*method, Method::OPTIONS | Method::TRACE | Method::CONNECT))
    else {
        return Access::AnyToken;
    };
    if ADMIN_ROUTES.contains(&route) {
        Access::Scope(Scope::Admin)
    } else if is_read_method(method) {
        Access::Scope(Scope::Read)
    } else {
        Access::Scope(Scope::Ingest)
    }
}

/// The challenges of a `401`'s `WWW-Authenticate`, one header value each, in the order sent:
/// `Bearer` (RFC 6750), the form this server asks for, and `Basic` (RFC 7617), since a token is
/// also taken as a Basic password. Many clients send Basic credentials only once a `Basic`
/// challenge asks for them (curl `--anyauth`, Python's `HTTPBasicAuthHandler`, Java's and
/// .NET's HTTP clients); offered `Bearer` alone, they never authenticated (an audit's finding).
/// Two header values rather than one comma-separated list: RFC 9110 allows both, and more
/// clients parse the first.
pub const CHALLENGES: [&str; 2] = ["Bearer realm=\"flightlog\"", "Basic realm=\"flightlog\""];

/// Add the [`CHALLENGES`] to a `401`'s headers.
pub(crate) fn insert_challenges(headers: &mut HeaderMap) {
    headers.remove(header::WWW_AUTHENTICATE);
    for challenge in CHALLENGES {
        headers.append(
            header::WWW_AUTHENTICATE,
            axum::http::HeaderValue::from_static(challenge),
        );
    }
}

/// Whether the request's headers carry a token this server accepts, whatever its scopes (`true`
/// when no token is configured: every request is then trusted as much). For a public route
/// that says more to those who may read the data (`/healthz`'s reason with its file paths).
pub(crate) fn shows_accepted_token(auth: &AuthConfig, headers: &HeaderMap) -> bool {
    if !auth.is_enabled() {
        return true;
    }
    matches!(bearer_token(headers), Ok(Some(token)) if auth.scopes_of(&token).is_some())
}

/// The token an `Authorization` header value carries: `Bearer <token>`, or `Basic` with the
/// token as the password (schemes in any case). `Err` names the accepted forms.
pub fn presented_token(value: &str) -> Result<String, String> {
    let malformed = || {
        "the Authorization header must be `Bearer <token>` (or `Basic` with the token as the \
         password)"
            .to_owned()
    };
    let (scheme, credentials) = value.trim().split_once(' ').ok_or_else(malformed)?;
    let credentials = credentials.trim_start();
    if credentials.is_empty() {
        return Err(malformed());
    }
    if scheme.eq_ignore_ascii_case("bearer") {
        return Ok(credentials.to_owned());
    }
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err(malformed());
    }
    let decoded = BASIC_CREDENTIALS
        .decode(credentials)
        .map_err(|_| "the Basic credentials are not base64".to_owned())?;
    let decoded = String::from_utf8(decoded)
        .map_err(|_| "the Basic credentials are not UTF-8 text".to_owned())?;
    let (_user, password) = decoded
        .split_once(':')
        .ok_or_else(|| "the Basic credentials must be `user:token`".to_owned())?;
    if password.is_empty() {
        return Err(malformed());
    }
    Ok(password.to_owned())
}

/// The token of the request's `Authorization` header, if it has one (see [`presented_token`]).
fn bearer_token(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    // Two credentials: honouring either would make the answer depend on the headers' order.
    if values.next().is_some() {
        return Err(ApiError::Unauthorized(
            "the Authorization header is given more than once; send one token".into(),
        ));
    }
    let text = value.to_str().map_err(|_| {
        ApiError::Unauthorized("the Authorization header must be visible ASCII text".into())
    })?;
    presented_token(text)
        .map(Some)
        .map_err(ApiError::Unauthorized)
}

/// The auth check of [`crate::gate`]: `Ok` when the request may go on (auth disabled, a public
/// route, or a token with the scope the route needs), else the `401`/`403` error. `Ok(true)`
/// when it showed a token the route needs (or no tokens are configured): such a request keeps
/// its connection from being closed to make room while it is in use (see
/// [`crate::connection_limit`]); a public route's (`/healthz`) does not.
pub(crate) fn check_token(
    state: &AppState,
    request: &Request,
    route: Option<&str>,
) -> Result<bool, ApiError> {
    let auth = &state.config().auth;
    if !auth.is_enabled() {
        crate::browser_guard::check(request.headers(), state.config().loopback_names_only)?;
        return Ok(true);
    }
    // A method its route does not serve gets the router's 405 with any token, as a path no
    // route serves gets its 404: taken by its method, `POST /healthz` with a read token was
    // "lacks the `ingest` scope" (an audit's finding), and 405 with an ingest one.
    let route = route.filter(|route| state.route_serves(route, request.method()));
    let access = required_access(request.method(), request.uri().path(), route);
    authorize(auth, access, request.method(), request.headers(), route)?;
    Ok(access != Access::Public)
}

fn authorize(
    auth: &AuthConfig,
    access: Access,
    method: &Method,
    headers: &HeaderMap,
    route: Option<&str>,
) -> Result<(), ApiError> {
    if access == Access::Public {
        return Ok(());
    }
    let token = bearer_token(headers)?.ok_or_else(|| {
        ApiError::Unauthorized(
            "this server needs `Authorization: Bearer <token>` (or HTTP Basic with the token \
             as the password) on every request but GET /healthz"
                .into(),
        )
    })?;
    let scopes = auth.scopes_of(&token).ok_or_else(|| {
        ApiError::Unauthorized(
            "the token is not one this server accepts: check the Bearer token (with Basic \
             credentials, the password)"
                .into(),
        )
    })?;
    match access {
        Access::Scope(scope) if !scopes.contains(scope) => Err(ApiError::Forbidden(format!(
            "this token lacks the `{scope}` scope that {method} {} needs",
            route.unwrap_or("this route")
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_authorization(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn tokens_are_matched_by_digest() {
        let auth = AuthConfig::open()
            .with_token("reader", Scopes::NONE.with(Scope::Read))
            .and_then(|auth| {
                auth.with_token("both", Scopes::NONE.with(Scope::Ingest).with(Scope::Admin))
            });
        let Ok(auth) = auth else {
            panic!("valid tokens: {auth:?}");
        };
        assert_eq!(auth.token_count(), 2);
        assert_eq!(
            auth.scopes_of("reader"),
            Some(Scopes::NONE.with(Scope::Read))
        );
        assert_eq!(
            auth.scopes_of("both"),
            Some(Scopes::NONE.with(Scope::Ingest).with(Scope::Admin))
        );
        assert_eq!(auth.scopes_of("reade"), None);
        assert_eq!(auth.scopes_of("readerx"), None);
        assert_eq!(auth.scopes_of(""), None);
        assert!(!format!("{auth:?}").contains("reader"), "{auth:?}");
    }

    #[test]
    fn a_token_configured_twice_is_refused_not_merged() {
        let mut auth = AuthConfig::open();
        assert_eq!(
            auth.add_token("same", Scopes::NONE.with(Scope::Read)),
            Ok(())
        );
        assert_eq!(
            auth.add_token("same", Scopes::NONE.with(Scope::Admin)),
            Err(TokenError::Duplicate)
        );
        assert_eq!(auth.scopes_of("same"), Some(Scopes::NONE.with(Scope::Read)));
    }

    #[test]
    fn unusable_tokens_are_refused() {
        let mut auth = AuthConfig::open();
        assert_eq!(auth.add_token("", Scopes::ALL), Err(TokenError::Empty));
        assert_eq!(
            auth.add_token("a b", Scopes::ALL),
            Err(TokenError::NotVisibleAscii)
        );
        assert_eq!(
            auth.add_token("caf\u{e9}", Scopes::ALL),
            Err(TokenError::NotVisibleAscii)
        );
        assert_eq!(auth.add_token("x", Scopes::NONE), Err(TokenError::NoScopes));
        assert!(!auth.is_enabled());
    }

    #[test]
    fn scopes_follow_the_method_except_for_admin_routes_and_healthz() {
        let cases = [
            (Method::GET, "/healthz", Some("/healthz"), Access::Public),
            (Method::HEAD, "/healthz", Some("/healthz"), Access::Public),
            (
                Method::POST,
                "/healthz",
                Some("/healthz"),
                Access::Scope(Scope::Ingest),
            ),
            (Method::GET, "/nothing", None, Access::AnyToken),
            (
                Method::GET,
                "/v1/activity/cursor",
                Some("/v1/activity/cursor"),
                Access::Scope(Scope::Read),
            ),
            (
                Method::PATCH,
                "/v1/activity/spans/s",
                Some("/v1/activity/spans/{spanId}"),
                Access::Scope(Scope::Ingest),
            ),
            (
                Method::POST,
                "/v1/engagements/e/compact",
                Some("/v1/engagements/{engagementId}/compact"),
                Access::Scope(Scope::Admin),
            ),
            (
                Method::PUT,
                "/v1/testing/clock",
                Some("/v1/testing/clock"),
                Access::Scope(Scope::Admin),
            ),
            (
                Method::OPTIONS,
                "/v1/activity/runs",
                Some("/v1/activity/runs"),
                Access::AnyToken,
            ),
            (
                Method::OPTIONS,
                "/v1/engagements/prune",
                Some("/v1/engagements/prune"),
                Access::AnyToken,
            ),
        ];
        for (method, path, route, expected) in cases {
            assert_eq!(
                required_access(&method, path, route),
                expected,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn the_bearer_and_basic_schemes_are_case_insensitive_and_required() {
        assert_eq!(bearer_token(&HeaderMap::new()), Ok(None));
        for (header, token) in [
            ("Bearer abc", "abc"),
            ("bearer   abc", "abc"),
            // base64("user:s3cret") and base64(":s3cret"): the token is the password.
            ("Basic dXNlcjpzM2NyZXQ=", "s3cret"),
            ("basic OnMzY3JldA==", "s3cret"),
            // The same without the `=` padding.
            ("Basic dXNlcjpzM2NyZXQ", "s3cret"),
            ("basic OnMzY3JldA", "s3cret"),
        ] {
            assert_eq!(
                bearer_token(&with_authorization(header)),
                Ok(Some(token.to_owned())),
                "{header}"
            );
        }
        for bad in [
            "Basic !!!",
            "Basic dXNlcg==",
            "Basic dXNlcjo=",
            "Digest abc",
            "Bearer",
            "Bearer ",
            "abc",
        ] {
            assert_eq!(
                bearer_token(&with_authorization(bad)).map_err(|e| e.code()),
                Err("unauthorized"),
                "{bad}"
            );
        }
    }
}
