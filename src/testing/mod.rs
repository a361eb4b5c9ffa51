//! Test support shared by the integration tests and the benchmarks: fakes of the services
//! Sabi talks to, as real HTTP servers on random local ports, and signed webhooks. Built with
//! the `testing` feature only.

pub mod chatwoot;
pub mod graph;
pub mod llm;
pub mod webhook;
