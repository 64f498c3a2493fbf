//! [`Locked`]: what makes a graph that holds MLX arrays shareable between
//! threads, as the ABI's `ModelGraph: Send + Sync` asks, without an
//! `unsafe impl Sync` in the plugin.
//!
//! Why a lock and not `unsafe impl Sync`: mlx-rs's `Array` is `Send` but not
//! `Sync`, and rightly so for a lazy array: evaluating it writes its data
//! and detaches its graph, so two threads evaluating the same array at once
//! would race inside MLX. A graph's weights are evaluated at load, but a
//! graph may also keep lazily computed constants (RoPE frequencies, scales),
//! and the compiler cannot tell them apart. The host runs one model's
//! forward passes on one thread at a time (its engine thread), so this lock
//! is taken and released without ever being contended: it costs an atomic
//! operation per call and makes the sharing sound whatever the graph holds.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// A value that threads take turns with: `Sync` whenever `T` is `Send`.
pub struct Locked<T>(Mutex<T>);

impl<T> Locked<T> {
    pub fn new(value: T) -> Self {
        Self(Mutex::new(value))
    }

    /// The value, for as long as the guard lives. Do not call back into the
    /// same `Locked` while holding it (it is not re-entrant). A panic caught
    /// by `guard` while the value was held does not lock it out: the value
    /// is read-only after load, so it is handed out again.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shareable<T: Send + Sync>() {}

    #[test]
    fn an_array_holder_is_shareable_and_survives_a_panic() {
        struct Weights(#[allow(dead_code)] mlx_rs::Array);
        shareable::<Locked<Weights>>();
        let l = Locked::new(3);
        let _ = crate::guard(|| -> Result<(), plugin_api::PluginError> {
            let _held = l.lock();
            panic!("boom")
        });
        assert_eq!(*l.lock(), 3);
        assert_eq!(l.into_inner(), 3);
    }
}
