//! initiator
