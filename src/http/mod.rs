//! HTTP plumbing shared by every route: the server's connection-level defences.

pub mod serve;
