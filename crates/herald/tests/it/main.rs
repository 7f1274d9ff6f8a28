//! Integration tests: a real Herald server on port 0, real HTTP, real receivers, real
//! SQLite. One test binary so the suite links once.

mod api;
mod bench;
mod delivery;
mod health;
mod lifecycle;
mod postgres;
mod sdk;
mod support;
