//! Arbitrary bytes from the broker's socket through the frame filter
//! (core/src/transport/frame_filter/), as lapin reads them.
//!
//! Checks: no panic; the read contract lapin relies on (acemq::fuzzing::filter
//! asserts it); the same output however the socket's reads and lapin's
//! buffers fall; and lapin's parser, run over the output, never overflows
//! its stack (a deep table the filter let through would).
#![no_main]

use libfuzzer_sys::fuzz_target;

mod common;

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let (ctl, stream) = data.split_at(3);
    // Read sizes from 1 byte up, two of them alternating, and lapin's
    // buffer from 1 byte to 64 KiB.
    let chunks = [1 + ctl[0] as usize, 1 + (ctl[1] as usize) * 3];
    let buf_len = 1 + (ctl[2] as usize) * 257;
    let whole = acemq::fuzzing::filter(stream, &[], 1 << 17, 0);
    let split = acemq::fuzzing::filter(stream, &chunks, buf_len, 0);
    assert!(whole == split, "the output depends on how the reads fell ({chunks:?}, buffer {buf_len})");
    let mut rest = &whole[..];
    while let Ok((next, _)) = amq_protocol::frame::parse_frame(rest) {
        if next.len() == rest.len() {
            break;
        }
        rest = next;
    }
});
