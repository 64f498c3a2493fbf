//! Weights loaded once per plugin and key, shared by every instance that
//! asks: a drafter the host opens once per batch row keeps only its own
//! caches and state, not another copy of its weights.

use crate::Locked;
use std::any::Any;
use std::sync::{Arc, Mutex, Weak};

type Entry = (String, Weak<dyn Any + Send + Sync>);

/// What is alive somewhere, by key (dropped with its last user).
static LOADED: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

/// The value loaded under `key` while anyone still holds it, else `load`'s
/// (kept for the next caller while held). A key names one type.
pub fn shared<T: Send + 'static, E>(key: &str, load: impl FnOnce() -> Result<T, E>) -> Result<Arc<Locked<T>>, E> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    loaded.retain(|(_, w)| w.strong_count() > 0);
    let alive = loaded.iter().filter(|(k, _)| k == key).find_map(|(_, w)| w.upgrade());
    if let Some(value) = alive.and_then(|a| a.downcast::<Locked<T>>().ok()) {
        return Ok(value);
    }
    let value = Arc::new(Locked::new(load()?));
    let erased: Arc<dyn Any + Send + Sync> = value.clone();
    loaded.push((key.to_owned(), Arc::downgrade(&erased)));
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_load_per_key_while_held_and_again_once_dropped() {
        let mut loads = 0;
        let mut load = |v: u32| {
            loads += 1;
            Ok::<_, ()>(v)
        };
        let a = shared("k", || load(1)).unwrap();
        let b = shared("k", || load(2)).unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let other = shared("other", || load(3)).unwrap();
        assert_eq!((*a.lock(), *other.lock()), (1, 3));
        drop((a, b));
        let c = shared("k", || load(4)).unwrap();
        assert_eq!((*c.lock(), loads), (4, 3));
        assert_eq!(shared::<u32, &str>("failing", || Err("no")).err(), Some("no"));
    }
}
