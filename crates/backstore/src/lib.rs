//! backstore
