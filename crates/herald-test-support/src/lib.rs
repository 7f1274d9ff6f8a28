//! What Herald's tests and its benchmark need around Herald, kept out of the product:
//! throwaway PostgreSQL clusters ([`pg_cluster`]), throwaway message brokers for event
//! destinations ([`brokers`]) and a real HTTP receiver that records every request and
//! answers as its script says ([`receiver`]).

pub mod brokers;
pub mod pg_cluster;
pub mod receiver;

pub use receiver::{Gate, Received, Receiver, Reply};
