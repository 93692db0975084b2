//! grants
