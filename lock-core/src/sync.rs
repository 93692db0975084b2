//! Small synchronization helpers shared by lock-core and the backends.

use std::sync::{Mutex, MutexGuard};

/// Locks a std mutex, ignoring poisoning.
///
/// Rule: use it only for state that every critical section leaves valid at each point it
/// can panic (maps and counters updated in one step), so a panic elsewhere never makes the
/// lock tables unusable.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
