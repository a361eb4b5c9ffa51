//! Test support shared by the integration tests and the benchmarks: fakes of the services
//! Sabi talks to, as real HTTP servers on random local ports. Built with the `testing`
//! feature only.

pub mod graph;
pub mod llm;
