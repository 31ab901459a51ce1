//! Message headers as JSON values: what both Ruby and Rust hand over, and what
//! maps onto an AMQP field table without surprises.

use serde_json::{Map, Value};

/// Header name to value. Strings, integers, floats, booleans, arrays and
/// tables survive the round trip through AMQP; byte arrays arrive as strings.
pub type Headers = Map<String, Value>;
