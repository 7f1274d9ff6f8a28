//! The records the store keeps, independent of any database, by subject.

mod access;
mod catalog;
mod health;
mod messages;
mod pollers;

pub use access::*;
pub use catalog::*;
pub use health::*;
pub use messages::*;
pub use pollers::*;
