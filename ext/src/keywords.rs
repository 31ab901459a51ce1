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

    /// A whole number under `name` (absent or nil: None) within `0..=max`,
    /// or ConfigurationError naming `what` and the range: not Ruby's
    /// RangeError, TypeError or FloatDomainError from the conversion, and
    /// never 1.5 read as 1.
    pub(crate) fn whole(&self, name: &str, what: &str, max: u64) -> Result<Option<u64>, Error> {
        let ruby = Ruby::get_with(self.hash);
        let Some(value) = self.get::<Value>(name)? else { return Ok(None) };
        let n = magnus::Integer::from_value(value).and_then(|i| i.to_i64().ok()).and_then(|n| u64::try_from(n).ok());
        match n {
            Some(n) if n <= max => Ok(Some(n)),
            _ => Err(Error::new(
                ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
                format!("{what} must be a whole number from 0 to {max} (got {})", value.inspect()),
            )),
        }
    }

    /// Seconds under `name` (absent or nil: None): a number, else
    /// ConfigurationError naming `what`; core's range check follows.
    pub(crate) fn seconds(&self, name: &str, what: &str) -> Result<Option<std::time::Duration>, Error> {
        let ruby = Ruby::get_with(self.hash);
        let Some(value) = self.get::<Value>(name)? else { return Ok(None) };
        let secs = magnus::Float::from_value(value)
            .map(|f| f.to_f64())
            .or_else(|| magnus::Integer::from_value(value).and_then(|_| f64::try_convert(value).ok()));
        match secs {
            Some(s) => crate::convert::seconds(&ruby, what, s).map(Some),
            None => Err(Error::new(
                ruby.get_inner(&crate::errors::CONFIGURATION_ERROR_CLASS),
                format!("{what} must be a number of seconds (got {})", value.inspect()),
            )),
        }
    }

    /// The value under `name`, `default` when it is absent or nil.
    pub(crate) fn get_or<T: TryConvert>(&self, name: &str, default: T) -> Result<T, Error> {
        Ok(self.get(name)?.unwrap_or(default))
    }
}
