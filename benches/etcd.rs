//! The etcd backend against etcd's own lock RPC (placeholder being written).
fn main() {}
