//! iscsi
