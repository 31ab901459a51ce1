//! A native's options as a keyword Hash, read by name: the Ruby method that
//! wraps a native passes `_replay(queue, limit: 5, discard: true)` rather than
//! a row of positions, and every key must be one the native reads, so a
//! misspelt name raises ArgumentError instead of passing as absent.

use magnus::{prelude::*, r_hash::ForEach, Error, RHash, Ruby, Symbol, TryConvert, Value};

/// The keyword Hash one native call was given, its keys checked.
pub(crate) struct Keywords {
    hash: RHash,
}

impl Keywords {
    /// `hash`, or ArgumentError naming the first key that is not one of
    /// `known` (or not a Symbol); `native` names the method in the message.
    pub(crate) fn read(ruby: &Ruby, hash: RHash, native: &str, known: &[&str]) -> Result<Self, Error> {
        let mut unknown: Option<Value> = None;
        hash.foreach(|key: Value, _: Value| {
            let name = Symbol::from_value(key).and_then(|s| s.name().ok());
            if name.is_some_and(|n| known.contains(&n.as_ref())) {
                Ok(ForEach::Continue)
            } else {
                unknown = Some(key);
                Ok(ForEach::Stop)
            }
        })?;
        match unknown {
            None => Ok(Keywords { hash }),
            Some(key) => Err(Error::new(
                ruby.exception_arg_error(),
                format!("unknown keyword {} for {native}: it reads {}", key.inspect(), known.join(", ")),
            )),
        }
    }

    /// The value under `name`; None when it is absent or nil.
    pub(crate) fn get<T: TryConvert>(&self, name: &str) -> Result<Option<T>, Error> {
        let ruby = Ruby::get_with(self.hash);
        self.hash.lookup::<_, Option<T>>(ruby.to_symbol(name))
    }

    /// The value under `name`, `default` when it is absent or nil.
    pub(crate) fn get_or<T: TryConvert>(&self, name: &str, default: T) -> Result<T, Error> {
        Ok(self.get(name)?.unwrap_or(default))
    }
}
