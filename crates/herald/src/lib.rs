//! Herald: a self-hosted webhook and postback delivery service that speaks the Svix API.
//!
//! The flow of a message: [`api`] accepts it, [`ingest`] commits it with one delivery per
//! matching endpoint ([`catalog`] knows the routes) through the [`store`], and hands the
//! deliveries to the [`dispatch`]er, which picks fairly among applications and runs each
//! attempt through [`deliver`] (signed by [`signing`], guarded by [`ssrf`]). [`outcome`]
//! and [`retry`] decide what an attempt's result means and when to try again.

pub mod alerts;
pub mod api;
pub mod brand;
pub mod breaker;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod data_dir;
pub mod dead_letters;
pub mod deliver;
pub mod delivery_auth;
pub mod destinations;
pub mod dispatch;
pub mod egress;
pub mod endpoint_settings;
pub mod headers;
pub mod health;
pub mod history;
pub mod housekeeping;
pub mod ids;
pub mod import;
pub mod ingest;
pub mod latency;
pub mod metrics;
pub mod operator_client;
pub mod outcome;
pub mod postback;
pub mod preflight;
pub mod redaction;
pub mod replay;
pub mod retry;
pub mod scripts;
pub mod sealing;
pub mod server;
pub mod serving;
pub mod signing;
pub mod ssrf;
pub mod store;
pub mod supervisor;
pub mod telemetry;
pub mod throttle;
pub mod traceparent;

pub mod web;

pub use config::Config;
pub use server::Server;
