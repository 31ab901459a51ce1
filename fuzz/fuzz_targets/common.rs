//! Frames built by hand, and what lapin's parser and generator make of
//! them, for the targets that wrap fuzzed bytes in a real delivery.
#![allow(dead_code)]

use amq_protocol::frame::{gen_frame, parse_frame, AMQPContentHeader, AMQPFrame};
use amq_protocol::protocol::basic::AMQPProperties;

pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_END: u8 = 0xCE;
/// Content-header property flags (bit 15 is content_type).
pub const CONTENT_TYPE: u16 = 1 << 15;
pub const HEADERS: u16 = 1 << 13;

pub fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(FRAME_END);
    f
}

pub fn short(s: &[u8]) -> Vec<u8> {
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s);
    v
}

pub fn long(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

/// basic.deliver on `channel`, as RabbitMQ sends it.
pub fn deliver(channel: u16) -> Vec<u8> {
    let mut p = 60u16.to_be_bytes().to_vec();
    p.extend_from_slice(&60u16.to_be_bytes());
    p.extend(short(b"amq.ctag-fuzz"));
    p.extend_from_slice(&1u64.to_be_bytes());
    p.push(0);
    p.extend(short(b""));
    p.extend(short(b"q"));
    frame(FRAME_METHOD, channel, &p)
}

/// A content header of class basic: `props` are the property flags and
/// the properties' bytes, as they would follow the body size.
pub fn header(channel: u16, body_size: u64, props: &[u8]) -> Vec<u8> {
    let mut p = 60u16.to_be_bytes().to_vec();
    p.extend_from_slice(&0u16.to_be_bytes());
    p.extend_from_slice(&body_size.to_be_bytes());
    p.extend_from_slice(props);
    frame(FRAME_HEADER, channel, &p)
}

/// One delivery of `body` whose content header carries `props`.
pub fn delivery(props: &[u8], body: &[u8]) -> Vec<u8> {
    let mut s = deliver(1);
    s.extend(header(1, body.len() as u64, props));
    s.extend(frame(FRAME_BODY, 1, body));
    s
}

/// The frames lapin's parser makes of `bytes`: every one must parse (the
/// frame filter's promise for what it has checked).
pub fn parse_all(mut bytes: &[u8]) -> Vec<AMQPFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let (rest, f) = parse_frame(bytes).unwrap_or_else(|e| panic!("lapin's parser refused the filtered bytes: {e:?}"));
        frames.push(f);
        bytes = rest;
    }
    frames
}

/// The properties of the one content header in `frames`.
pub fn properties_of(frames: &[AMQPFrame]) -> AMQPProperties {
    let mut found = frames.iter().filter_map(|f| match f {
        AMQPFrame::Header(_, h) => Some(h.properties.clone()),
        _ => None,
    });
    let p = found.next().expect("a content header came through");
    assert!(found.next().is_none(), "one content header in, one out");
    p
}

/// The content-header frame lapin would send with `properties`, encoded.
pub fn encoded_header(properties: AMQPProperties) -> Vec<u8> {
    let f = AMQPFrame::Header(1, AMQPContentHeader { class_id: 60, body_size: 2, properties });
    cookie_factory::gen_simple(gen_frame(&f), Vec::new()).expect("lapin encodes the copy's properties")
}
