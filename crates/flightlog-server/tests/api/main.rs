//! The HTTP API tested on a real server bound to `127.0.0.1:0` with a real HTTP client: every
//! endpoint with its successes and the contract's error statuses (`endpoints`), and the
//! reference's conformance fixtures replayed through HTTP (`conformance`), and the live SSE
//! streams under load (`streams`), bearer-token auth on every route (`auth`), and the write
//! limit's `503` under overload (`overload`). One test binary, so the suite links once.

mod auth;
mod conformance;
mod endpoints;
mod overload;
mod streams;
mod support;
