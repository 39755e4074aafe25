//! wan
