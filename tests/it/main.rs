//! One integration binary: Sabi started for real, on random ports, with real files.

// Test modules share helpers through `pub` items of a private module.
#![allow(unreachable_pub)]

mod abuse;
mod admin;
mod agent;
mod billing;
mod broadcasts;
mod browser;
mod chatwoot;
mod cli;
mod conformance;
mod corpus;
mod crash;
mod customers;
mod desk_webhook;
mod edge;
mod engine;
mod fuzz;
mod guard;
mod helpers;
mod identity;
mod layers;
mod markers;
mod marketing;
mod metrics;
mod names;
mod nodes;
mod openapi;
mod postgres;
mod router;
mod sender;
mod services;
mod surge;
mod upgrades;
mod walk;
mod webchat;
mod webhook;
mod words;
mod workers;
