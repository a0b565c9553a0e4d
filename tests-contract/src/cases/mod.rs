//! The contract cases: plain async functions taking a [`Spec`](crate::Spec).

pub mod basic;
pub mod cache;
pub mod cache_receipts;
pub mod gc;
pub mod heal;
pub mod model;
pub mod refs;
pub mod seam;
pub mod verified;
