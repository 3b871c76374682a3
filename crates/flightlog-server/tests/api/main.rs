//! The HTTP API tested on a real server bound to `127.0.0.1:0` with a real HTTP client: every
//! endpoint with its successes and the contract's error statuses (`endpoints`), and the
//! reference's conformance fixtures replayed through HTTP (`conformance`), and the live SSE
//! streams under load (`streams`), bearer-token auth on every route (`auth`), and the write
//! limit's `503` under overload (`overload`), the budget of bodies in flight (`request_budget`),
//! the generated OpenAPI document (`openapi`) and the
//! Prometheus metrics (`metrics`), and real OpenTelemetry SDK clients (Python http/protobuf and
//! gRPC, JavaScript OTLP/JSON) exporting to it (`otlp_clients`), and a seeded fuzz of every
//! endpoint with malformed input that must get contract errors and lose nothing (`fuzz`), and a
//! seeded fuzz of OTLP trace ingest over protobuf, OTLP/JSON and gRPC (`otlp_fuzz`), and the
//! scheduled maintenance's passes over a real database (`maintenance`). One
//! test binary, so the suite links once.

mod auth;
mod conformance;
mod connection_limit;
mod endpoints;
mod fuzz;
mod keep_alive;
mod maintenance;
mod metrics;
mod openapi;
mod otlp;
mod otlp_clients;
mod otlp_fuzz;
mod overload;
mod parse_errors;
mod request_budget;
mod streams;
mod support;
