//! Being written.

use magnus::{Error, RModule, Ruby};

pub fn init(_ruby: &Ruby, _amqp: RModule) -> Result<(), Error> {
    Ok(())
}
