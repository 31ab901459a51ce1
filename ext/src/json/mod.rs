//! JSON to Ruby objects, as `JSON.parse` would build them (string keys,
//! frozen): a payload straight from its bytes (`body_to_ruby`), headers and
//! events from serde_json values; and a payload back to JSON text
//! (`encode`). One concept a file:
//!
//! - `value`: serde_json values (headers, events) to Ruby objects;
//! - `body`: a payload's body to Ruby objects, and which reader reads it;
//! - `objects`: the first reader, core's `json_read` building Ruby objects;
//! - `seed`: the second, serde_json's deserializer building them;
//! - `raw`: the Strings, Hashes and Arrays both readers make through Ruby's
//!   C API directly;
//! - `keys`: the table of interned Hash keys both readers share;
//! - `encode`: a payload as JSON text, as `JSON.generate` writes it.

mod body;
mod encode;
mod keys;
mod objects;
mod raw;
mod seed;
mod value;

pub use body::{body_to_ruby, build_protected, not_json, Built};
pub use encode::{encode, generate};
pub use value::{map_to_ruby, parse, to_ruby};
