//! Integration tests: a real Herald server on port 0, real HTTP, real receivers, real
//! SQLite. One test binary so the suite links once.

mod alerts;
mod api;
mod backup;
mod check_config;
mod compat;
mod dashboard;
mod dead_letters;
mod delivery;
mod delivery_auth;
mod docs;
mod egress;
mod faults;
mod hardening;
mod health;
mod hostile;
mod hostile_tenant;
mod import;
mod isolation;
mod lifecycle;
mod otel;
mod pages;
mod pollers;
mod portal;
mod postbacks;
mod postgres;
mod readme;
mod redaction;
mod resume;
mod retention;
mod scripts;
mod sdk;
mod sessions;
mod ssrf;
mod support;
mod tenancy;
