use super::*;
use amq_protocol::frame::{parse_frame, AMQPFrame};
use amq_protocol::protocol::{basic, AMQPClass};
use lapin::types::{AMQPValue, FieldTable};

// ---- building frames by hand, hostile ones included ----

fn frame(kind: u8, channel: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&channel.to_be_bytes());
    f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    f.extend_from_slice(payload);
    f.push(FRAME_END);
    f
}

fn short(s: &[u8]) -> Vec<u8> {
    let mut v = vec![s.len() as u8];
    v.extend_from_slice(s);
    v
}

fn long(s: &[u8]) -> Vec<u8> {
    let mut v = (s.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(s);
    v
}

/// A table's bytes (length prefix included) from entries of a key, a
/// type letter and the value's bytes.
fn table(entries: &[(&[u8], u8, Vec<u8>)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (k, t, v) in entries {
        body.extend(short(k));
        body.push(*t);
        body.extend_from_slice(v);
    }
    long(&body)
}

fn method(channel: u16, class: u16, method: u16, args: &[u8]) -> Vec<u8> {
    let mut p = class.to_be_bytes().to_vec();
    p.extend_from_slice(&method.to_be_bytes());
    p.extend_from_slice(args);
    frame(FRAME_METHOD, channel, &p)
}

fn deliver(channel: u16, exchange: &[u8], routing_key: &[u8]) -> Vec<u8> {
    let mut a = short(b"ctag");
    a.extend_from_slice(&7u64.to_be_bytes());
    a.push(0);
    a.extend(short(exchange));
    a.extend(short(routing_key));
    method(channel, 60, 60, &a)
}

fn tune(frame_max: u32) -> Vec<u8> {
    tune_with(frame_max, 60)
}

fn tune_with(frame_max: u32, heartbeat: u16) -> Vec<u8> {
    let mut a = 2047u16.to_be_bytes().to_vec();
    a.extend_from_slice(&frame_max.to_be_bytes());
    a.extend_from_slice(&heartbeat.to_be_bytes());
    method(0, 10, 30, &a)
}

/// A content header with the given properties, each (flag bit, bytes),
/// highest bit first.
fn header(channel: u16, body_size: u64, props: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut p = 60u16.to_be_bytes().to_vec();
    p.extend_from_slice(&0u16.to_be_bytes());
    p.extend_from_slice(&body_size.to_be_bytes());
    let flags = props.iter().fold(0u16, |f, (bit, _)| f | (1 << bit));
    p.extend_from_slice(&flags.to_be_bytes());
    for (_, bytes) in props {
        p.extend_from_slice(bytes);
    }
    frame(FRAME_HEADER, channel, &p)
}

const CONTENT_TYPE: u8 = 15;
const HEADERS: u8 = 13;
const DELIVERY_MODE: u8 = 12;
const MESSAGE_ID: u8 = 7;
const TIMESTAMP: u8 = 6;
const TYPE: u8 = 5;

fn body(channel: u16, bytes: &[u8]) -> Vec<u8> {
    frame(FRAME_BODY, channel, bytes)
}

fn heartbeat() -> Vec<u8> {
    frame(FRAME_HEARTBEAT, 0, &[])
}

/// What a consumer reads of one clean AceMQ message, with the kind of
/// headers RabbitMQ adds (x-death: an array of tables).
fn clean_message(channel: u16, payload: &[u8]) -> Vec<u8> {
    let death = table(&[(b"count", b'l', 3i64.to_be_bytes().to_vec()), (b"queue", b'S', long(b"payments"))]);
    let mut deaths = vec![b'F'];
    deaths.extend(death);
    let headers = table(&[
        (b"x-acemq-id", b'S', long(b"0190a1b2-c3d4")),
        (b"x-acemq-attempt", b'l', 1i64.to_be_bytes().to_vec()),
        (b"x-death", b'A', long(&deaths)),
        (b"nested", b'F', table(&[(b"k", b'S', long("vé".as_bytes()))])),
        (b"flag", b't', vec![1]),
    ]);
    let mut m = deliver(channel, b"orders", b"order.placed");
    m.extend(header(
        channel,
        payload.len() as u64,
        &[
            (CONTENT_TYPE, short(b"application/json")),
            (HEADERS, headers),
            (DELIVERY_MODE, vec![2]),
            (MESSAGE_ID, short(b"0190a1b2-c3d4")),
            (TIMESTAMP, 1_700_000_000u64.to_be_bytes().to_vec()),
            (TYPE, short(b"order.placed.v1")),
        ],
    ));
    m.extend(body(channel, payload));
    m
}

/// A table holding `levels` tables, each in the next: {"a": {"a": ... {"v": 1}}}.
fn deep_tables(levels: usize) -> Vec<u8> {
    let mut inner = table(&[(b"v", b'I', 1i32.to_be_bytes().to_vec())]);
    for _ in 0..levels {
        inner = table(&[(b"a", b'F', inner)]);
    }
    inner
}

/// An array holding `levels` arrays, each in the next.
fn deep_arrays(levels: usize) -> Vec<u8> {
    let mut inner = long(b"V");
    for _ in 0..levels {
        let mut element = vec![b'A'];
        element.extend(inner);
        inner = long(&element);
    }
    table(&[(b"arr", b'A', inner)])
}

// ---- reading through the filter ----

/// The broker's side: hands out `data` `chunk` bytes at a time, and
/// answers Pending before every read when `pending` is set.
struct Script {
    data: Vec<u8>,
    pos: usize,
    chunk: usize,
    pending: bool,
    owed: bool,
    last_was_pending: bool,
}

impl AsyncRead for Script {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        if self.pending && !self.owed {
            self.owed = true;
            self.last_was_pending = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.owed = false;
        self.last_was_pending = false;
        let n = self.chunk.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Poll::Ready(Ok(n))
    }
}

/// Everything lapin would read through the filter, `chunk` bytes per
/// read from the broker into buffers of `buf_len`. Checks the contract
/// lapin relies on as it goes: Pending only after the broker's side
/// said Pending, and 0 only once everything has been read.
fn read_through(data: &[u8], chunk: usize, buf_len: usize, pending: bool) -> (Vec<u8>, Filtered<Script>) {
    let script = Script { data: data.to_vec(), pos: 0, chunk, pending, owed: false, last_was_pending: false };
    let mut filtered = Filtered::new(script, 0);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut buf = vec![0u8; buf_len];
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut filtered).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(0)) => break,
            Poll::Ready(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Poll::Ready(Err(e)) => panic!("{e}"),
            Poll::Pending => assert!(filtered.inner.last_was_pending, "Pending without the inner stream's"),
        }
    }
    assert_eq!(filtered.inner.pos, data.len(), "0 returned before the end of the stream");
    (out, filtered)
}

/// The frames lapin's parser makes of the bytes: every one must parse.
fn parsed(mut bytes: &[u8]) -> Vec<AMQPFrame> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let (rest, f) = parse_frame(bytes).unwrap_or_else(|e| panic!("lapin's parser refused the filtered bytes: {e:?}"));
        frames.push(f);
        bytes = rest;
    }
    frames
}

fn filtered(data: &[u8]) -> Vec<AMQPFrame> {
    parsed(&read_through(data, usize::MAX, 1 << 16, false).0)
}

fn headers_of(frames: &[AMQPFrame]) -> Vec<basic::AMQPProperties> {
    frames
        .iter()
        .filter_map(|f| match f {
            AMQPFrame::Header(_, h) => Some(h.properties.clone()),
            _ => None,
        })
        .collect()
}

fn marker(props: &basic::AMQPProperties) -> Option<String> {
    let h = props.headers().as_ref()?;
    match h.inner().get(MALFORMED_HEADER)? {
        AMQPValue::LongString(s) => Some(String::from_utf8(s.as_bytes().to_vec()).expect("the marker is UTF-8")),
        other => panic!("marker is {other:?}"),
    }
}

const SIZES: [usize; 6] = [1, 2, 5, 13, 4096, usize::MAX];

#[test]
fn clean_frames_pass_byte_identical_however_the_reads_fall() {
    let mut data = b"".to_vec();
    data.extend(tune(131_072));
    for i in 0..5 {
        data.extend(clean_message(1 + i % 2, format!("{{\"n\":{i}}}").as_bytes()));
        data.extend(heartbeat());
    }
    for chunk in SIZES {
        for buf_len in [1, 3, 8, 100, 65_536] {
            for pending in [false, true] {
                let (out, _) = read_through(&data, chunk, buf_len, pending);
                assert!(out == data, "chunk {chunk}, buffer {buf_len}, pending {pending}: bytes changed");
            }
        }
    }
    assert_eq!(headers_of(&parsed(&data)).len(), 5);
}

#[test]
fn body_frames_stream_through_unchanged_without_being_buffered() {
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let mut data = clean_message(1, b"{}");
    for part in big.chunks(131_064) {
        data.extend(body(1, part));
        data.extend(heartbeat());
    }
    let (out, f) = read_through(&data, 16_384, 65_536, false);
    assert!(out == data);
    // Nothing of the body was held: it went where lapin reads.
    assert!(f.input.capacity() < 4096 && f.output.capacity() < 4096, "{} {}", f.input.capacity(), f.output.capacity());
}

#[test]
fn several_frames_in_one_read_and_one_frame_over_many_reads() {
    let mut data = Vec::new();
    for i in 0..50 {
        data.extend(clean_message(1, format!("[{i}]").as_bytes()));
    }
    data.extend(deliver(1, b"", b"rk-\xff"));
    data.extend(header(1, 2, &[(MESSAGE_ID, short(b"id-\xfe"))]));
    data.extend(body(1, b"{}"));
    data.extend(clean_message(1, b"[50]"));
    for chunk in SIZES {
        for buf_len in [1, 7, 4096] {
            let (out, _) = read_through(&data, chunk, buf_len, chunk == 5);
            let frames = parsed(&out);
            let props = headers_of(&frames);
            assert_eq!(props.len(), 52, "chunk {chunk} buffer {buf_len}");
            assert!(marker(&props[50]).is_some());
            assert!(props.iter().enumerate().all(|(i, p)| (i == 50) == marker(p).is_some()));
        }
    }
}

#[test]
fn tables_nested_ten_thousand_deep_are_cut_at_the_depth_bound() {
    let mut data = clean_message(1, b"{}");
    data.extend(deliver(1, b"", b"q"));
    data.extend(header(1, 2, &[(HEADERS, deep_tables(10_000)), (MESSAGE_ID, short(b"deep-1"))]));
    data.extend(body(1, b"{}"));
    data.extend(clean_message(1, b"{}"));
    let frames = parsed(&read_through(&data, 1000, 4096, false).0);
    let props = headers_of(&frames);
    assert_eq!(props.len(), 3);
    let hostile = &props[1];
    assert_eq!(hostile.message_id().as_ref().map(|s| s.as_str()), Some("deep-1"));
    let m = marker(hostile).expect("marked");
    assert!(m.contains("nested deeper than 32 levels"), "{m}");
    // Walk down: 31 tables, then the 32nd level's "a" is a long string
    // holding the rest, raw.
    let mut t: FieldTable = hostile.headers().clone().unwrap();
    for level in 2..=MAX_HEADER_DEPTH {
        t = match t.inner().get("a") {
            Some(AMQPValue::FieldTable(inner)) => inner.clone(),
            other => panic!("level {level}: {other:?}"),
        };
    }
    match t.inner().get("a") {
        Some(AMQPValue::LongString(raw)) => assert_eq!(raw.as_bytes().len(), deep_tables(10_000 - MAX_HEADER_DEPTH).len() - 4),
        other => panic!("{other:?}"),
    }
    assert!(marker(&props[0]).is_none() && marker(&props[2]).is_none());
}

#[test]
fn arrays_nested_ten_thousand_deep_are_cut_at_the_depth_bound() {
    let mut data = deliver(1, b"", b"q");
    data.extend(header(1, 2, &[(HEADERS, deep_arrays(10_000))]));
    data.extend(body(1, b"{}"));
    for chunk in [1, 777, usize::MAX] {
        let props = headers_of(&parsed(&read_through(&data, chunk, 8192, false).0));
        let m = marker(&props[0]).expect("marked");
        assert!(m.contains("header \"arr[0][0]"), "{m}");
        let mut v = props[0].headers().as_ref().unwrap().inner().get("arr").cloned().unwrap();
        let mut levels = 1;
        while let AMQPValue::FieldArray(a) = v {
            v = a.as_slice()[0].clone();
            levels += 1;
        }
        assert!(matches!(v, AMQPValue::LongString(_)), "{v:?}");
        assert_eq!(levels, MAX_HEADER_DEPTH);
    }
}

#[test]
fn short_strings_that_are_not_utf8_are_repaired_one_byte_for_one_and_quoted() {
    let headers = table(&[(b"ok", b'S', long(b"v")), (b"k\xffey", b'S', long(b"\xff raw long strings are fine"))]);
    let data = header(
        1,
        2,
        &[
            (CONTENT_TYPE, short(b"application/json")),
            (HEADERS, headers),
            (MESSAGE_ID, short(b"id-\xff\xfe")),
            (TYPE, short(b"t\xc3")),
        ],
    );
    let props = headers_of(&filtered(&data));
    let p = &props[0];
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "id-??");
    assert_eq!(p.kind().as_ref().unwrap().as_str(), "t?");
    let h = p.headers().as_ref().unwrap().inner();
    assert!(h.contains_key("k?ey") && h.contains_key("ok"));
    match h.get("k?ey") {
        Some(AMQPValue::LongString(s)) => assert_eq!(s.as_bytes(), b"\xff raw long strings are fine"),
        other => panic!("{other:?}"),
    }
    let m = marker(p).unwrap();
    assert!(m.contains(r#"message_id: not UTF-8, was "id-\xff\xfe""#), "{m}");
    assert!(m.contains(r#"type: not UTF-8, was "t\xc3""#), "{m}");
    assert!(m.contains(r#"header name "k\xffey": not UTF-8"#), "{m}");
}

#[test]
fn a_message_without_headers_gets_a_table_for_the_marker() {
    let data = header(1, 2, &[(CONTENT_TYPE, short(b"application/json")), (DELIVERY_MODE, vec![2]), (MESSAGE_ID, short(b"\x80"))]);
    let p = &headers_of(&filtered(&data))[0];
    assert_eq!(p.content_type().as_ref().unwrap().as_str(), "application/json");
    assert_eq!(*p.delivery_mode(), Some(2));
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "?");
    assert!(marker(p).unwrap().contains("message_id"));
}

#[test]
fn a_deliver_whose_routing_key_is_not_utf8_marks_its_channels_next_header() {
    let mut data = deliver(3, b"ex-\xff", b"rk-\xfe");
    data.extend(deliver(4, b"", b"clean"));
    data.extend(header(4, 2, &[(MESSAGE_ID, short(b"other-channel"))]));
    data.extend(body(4, b"{}"));
    data.extend(header(3, 2, &[(MESSAGE_ID, short(b"clean-id"))]));
    data.extend(body(3, b"{}"));
    let frames = filtered(&data);
    match &frames[0] {
        AMQPFrame::Method(3, AMQPClass::Basic(basic::AMQPMethod::Deliver(d))) => {
            assert_eq!(d.exchange.as_str(), "ex-?");
            assert_eq!(d.routing_key.as_str(), "rk-?");
        }
        other => panic!("{other:?}"),
    }
    let props = headers_of(&frames);
    assert!(marker(&props[0]).is_none(), "channel 4 is not marked");
    let m = marker(&props[1]).unwrap();
    assert!(m.contains(r#"basic.deliver routing key: not UTF-8, was "rk-\xfe""#), "{m}");
    assert!(m.contains(r#"basic.deliver exchange: not UTF-8, was "ex-\xff""#), "{m}");
    assert_eq!(props[1].message_id().as_ref().unwrap().as_str(), "clean-id");
}

#[test]
fn get_ok_and_return_strings_are_repaired_too() {
    let mut get_ok = 9u64.to_be_bytes().to_vec();
    get_ok.push(0);
    get_ok.extend(short(b"\xff"));
    get_ok.extend(short(b"q\xff"));
    get_ok.extend_from_slice(&0u32.to_be_bytes());
    let mut ret = 312u16.to_be_bytes().to_vec();
    ret.extend(short(b"NO_ROUTE"));
    ret.extend(short(b""));
    ret.extend(short(b"\xfe"));
    let mut data = method(1, 60, 71, &get_ok);
    data.extend(header(1, 0, &[]));
    data.extend(method(2, 60, 50, &ret));
    data.extend(header(2, 0, &[]));
    let frames = filtered(&data);
    let props = headers_of(&frames);
    assert!(marker(&props[0]).unwrap().contains("basic.get-ok routing key"));
    assert!(marker(&props[1]).unwrap().contains("basic.return routing key"));
}

#[test]
fn an_unknown_type_letter_turns_the_smallest_table_around_it_into_a_long_string() {
    let inner = table(&[(b"fine", b'I', 5i32.to_be_bytes().to_vec()), (b"bad", b'Z', b"xyz".to_vec())]);
    let headers = table(&[(b"before", b'S', long(b"kept")), (b"outer", b'F', table(&[(b"inner", b'F', inner.clone())]))]);
    let p = &headers_of(&filtered(&header(1, 0, &[(HEADERS, headers)])))[0];
    let h = p.headers().as_ref().unwrap().inner();
    assert!(matches!(h.get("before"), Some(AMQPValue::LongString(_))));
    match h.get("outer") {
        Some(AMQPValue::FieldTable(t)) => match t.inner().get("inner") {
            Some(AMQPValue::LongString(raw)) => assert_eq!(raw.as_bytes(), &inner[4..]),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    let m = marker(p).unwrap();
    assert!(m.contains(r#"header "outer.inner.bad": unknown field type "Z"; the table "outer.inner" kept as a long string"#), "{m}");
}

#[test]
fn an_unknown_type_letter_at_the_top_keeps_the_entries_before_it_and_the_rest_raw() {
    let headers = table(&[(b"x-acemq-id", b'S', long(b"m-1")), (b"bad", b'Z', b"xyz".to_vec()), (b"after", b'V', vec![])]);
    let p = &headers_of(&filtered(&header(1, 2, &[(HEADERS, headers.clone())])))[0];
    let h = p.headers().as_ref().unwrap().inner();
    assert!(matches!(h.get("x-acemq-id"), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"m-1"));
    assert!(!h.contains_key("after"));
    match h.get(MALFORMED_RAW_HEADER) {
        Some(AMQPValue::LongString(raw)) => assert!(raw.as_bytes().starts_with(b"\x03badZxyz")),
        other => panic!("{other:?}"),
    }
    assert!(marker(p).unwrap().contains(r#"header "bad": unknown field type "Z""#));
}

#[test]
fn lengths_that_overrun_their_container_are_contained() {
    // An array that claims more than its table holds.
    let mut lying = vec![b'A'];
    lying.extend_from_slice(&1000u32.to_be_bytes());
    lying.extend_from_slice(b"tx");
    let nested = table(&[(b"liar", lying[0], lying[1..].to_vec())]);
    let p = &headers_of(&filtered(&header(1, 0, &[(HEADERS, table(&[(b"n", b'F', nested)]))])))[0];
    assert!(matches!(p.headers().as_ref().unwrap().inner().get("n"), Some(AMQPValue::LongString(_))));
    assert!(marker(p).unwrap().contains("runs past the end"));
    // A message_id longer than the frame: nothing after it can be found,
    // so the properties are replaced, the body size kept.
    let mut payload = 60u16.to_be_bytes().to_vec();
    payload.extend_from_slice(&0u16.to_be_bytes());
    payload.extend_from_slice(&2u64.to_be_bytes());
    payload.extend_from_slice(&(1u16 << MESSAGE_ID).to_be_bytes());
    payload.extend_from_slice(&[200, b'x']);
    let frames = filtered(&frame(FRAME_HEADER, 1, &payload));
    match &frames[0] {
        AMQPFrame::Header(1, h) => {
            assert_eq!(h.body_size, 2);
            assert!(marker(&h.properties).unwrap().contains("message_id runs past the end of the frame"));
            assert!(h.properties.message_id().is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn continuation_flags_and_trailing_bytes_are_dropped() {
    let mut payload = 60u16.to_be_bytes().to_vec();
    payload.extend_from_slice(&0u16.to_be_bytes());
    payload.extend_from_slice(&0u64.to_be_bytes());
    payload.extend_from_slice(&((1u16 << MESSAGE_ID) | 1).to_be_bytes());
    payload.extend_from_slice(&0u16.to_be_bytes());
    payload.extend(short(b"m-1"));
    payload.extend_from_slice(b"junk");
    let p = &headers_of(&filtered(&frame(FRAME_HEADER, 1, &payload)))[0];
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
    let m = marker(p).unwrap();
    assert!(m.contains("continued property flags dropped") && m.contains("4 bytes after the properties dropped"), "{m}");
}

#[test]
fn a_repaired_header_stays_within_frame_max() {
    // frame_max 4096 and a header frame that already fills it, with one
    // bad name: the marker does not fit beside the headers, so they go.
    let filler = vec![b'x'; 4050];
    let headers = table(&[(b"k\xff", b'S', long(&filler))]);
    let mut data = tune(4096);
    data.extend(header(1, 2, &[(HEADERS, headers), (MESSAGE_ID, short(b"m-1"))]));
    let hdr_len = data.len() - tune(4096).len();
    assert!(hdr_len <= 4096 && hdr_len > 4050);
    let (out, _) = read_through(&data, usize::MAX, 65_536, false);
    let frames = parsed(&out);
    let len = out.len() - tune(4096).len();
    assert!(len <= 4096, "{len}");
    let p = &headers_of(&frames)[0];
    assert_eq!(p.message_id().as_ref().unwrap().as_str(), "m-1");
    let m = marker(p).unwrap();
    assert!(m.contains("header name") && m.contains("dropped to keep the frame within frame_max (4096 bytes)"), "{m}");
    assert!(!p.headers().as_ref().unwrap().inner().contains_key("k?"));
}

#[test]
fn the_marker_is_bounded() {
    let entries: Vec<(Vec<u8>, u8, Vec<u8>)> =
        (0..400).map(|i| (format!("key-{i:03}-\u{1}").into_bytes().into_iter().chain([0xff]).collect(), b'V', vec![])).collect();
    let refs: Vec<(&[u8], u8, Vec<u8>)> = entries.iter().map(|(k, t, v)| (k.as_slice(), *t, v.clone())).collect();
    let p = &headers_of(&filtered(&header(1, 0, &[(HEADERS, table(&refs))])))[0];
    let m = marker(p).unwrap();
    assert!(m.len() <= MAX_MARKER, "{}", m.len());
    assert!(m.contains("more"), "{m}");
    assert_eq!(p.headers().as_ref().unwrap().inner().len(), 401);
}

#[test]
fn a_frame_is_buffered_as_its_bytes_arrive_not_as_large_as_it_claims() {
    // Found by the frame_filter fuzz target (fuzz/, issue 30): a tune
    // proposing a 4 GiB frame_max, then a method frame claiming 1.5 GiB
    // whose bytes never came, had the filter allocate and zero 1.5 GiB
    // (200 MB here). lapin refuses such a frame; the filter must not
    // have paid for it first.
    let mut data = tune(u32::MAX);
    let mut huge = method(1, 60, 60, b"");
    huge[3..7].copy_from_slice(&200_000_000u32.to_be_bytes());
    huge.truncate(20);
    data.extend_from_slice(&huge);
    let script = Script { data: data.clone(), pos: 0, chunk: 8, pending: false, owed: false, last_was_pending: false };
    let mut filtered = Filtered::new(script, 0);
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let mut buf = vec![0u8; 1 << 16];
    let mut out = Vec::new();
    loop {
        match Pin::new(&mut filtered).poll_read(&mut cx, &mut buf) {
            Poll::Ready(Ok(0)) => break,
            Poll::Ready(Ok(n)) => out.extend_from_slice(&buf[..n]),
            other => panic!("{other:?}"),
        }
        let buffered = filtered.input.capacity() + filtered.output.capacity();
        assert!(buffered <= 4 * READ_AHEAD, "buffered {buffered} bytes");
    }
    assert_eq!(out, data, "passed on as it came at the end of the stream");
}

#[test]
fn what_is_not_amqp_framing_switches_the_filter_off() {
    // The broker refusing our protocol version, then closing.
    let refusal = b"AMQP\x00\x00\x09\x01".to_vec();
    assert_eq!(read_through(&refusal, 3, 5, true).0, refusal);
    // A bad frame-end byte: from there on nothing is touched, not even
    // a header lapin would choke on (lapin reports the broken frame).
    let mut broken = header(1, 0, &[(MESSAGE_ID, short(b"ok"))]);
    *broken.last_mut().unwrap() = 0;
    broken.extend(header(1, 0, &[(MESSAGE_ID, short(b"\xff"))]));
    assert_eq!(read_through(&broken, usize::MAX, 4096, false).0, broken);
    let mut unknown = frame(9, 0, b"??");
    unknown.extend(header(1, 0, &[(MESSAGE_ID, short(b"\xff"))]));
    assert_eq!(read_through(&unknown, 2, 4096, false).0, unknown);
}

#[test]
fn connection_start_server_properties_are_depth_bounded_in_place() {
    let mut args = vec![0, 9];
    args.extend(deep_tables(100));
    args.extend(long(b"PLAIN"));
    args.extend(long(b"en_US"));
    let data = method(0, 10, 10, &args);
    let (out, _) = read_through(&data, 100, 4096, false);
    assert_eq!(out.len(), data.len(), "repaired in place");
    match &parsed(&out)[0] {
        AMQPFrame::Method(0, AMQPClass::Connection(_)) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn connection_start_gives_the_broker_version_past_nested_tables() {
    let caps = table(&[(b"basic.nack", b't', vec![1])]);
    let props = table(&[
        (b"capabilities", b'F', caps),
        (b"copyright", b'S', long(b"(c) someone")),
        (b"version", b'S', long(b"4.3.6")),
    ]);
    let mut args = vec![0, 9];
    args.extend(props);
    args.extend(long(b"PLAIN"));
    args.extend(long(b"en_US"));
    let mut frames = Frames::new(0);
    let slot = ServerVersion::default();
    frames.server = Some(slot.clone());
    let mut data = method(0, 10, 10, &args);
    let _ = frames.step(&mut data);
    assert_eq!(slot.lock().unwrap().as_deref(), Some("4.3.6"));
    assert_eq!(server_version(&[3, b'a']), None, "cut short");
    assert_eq!(server_version(&[1, b'v', b'Q']), None, "unknown type letter");
}

/// Through lapin itself, on a socket: a broker that sends a hostile
/// delivery between two good ones. Without the filter lapin's I/O
/// thread would close the connection at the second (or overflow its
/// stack); with it all three arrive, the middle one marked, and the
/// connection stays up.
#[tokio::test(flavor = "multi_thread")]
async fn lapin_reads_hostile_deliveries_through_the_filter() {
    use futures_lite::StreamExt;
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let broker = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut proto = [0u8; 8];
        s.read_exact(&mut proto).unwrap();
        let mut start = vec![0, 9];
        start.extend(table(&[(b"product", b'S', long(b"fake"))]));
        start.extend(long(b"PLAIN"));
        start.extend(long(b"en_US"));
        s.write_all(&method(0, 10, 10, &start)).unwrap();
        loop {
            let mut prefix = [0u8; 7];
            if s.read_exact(&mut prefix).is_err() {
                return;
            }
            let mut rest = vec![0u8; be32(&prefix[3..7]) as usize + 1];
            s.read_exact(&mut rest).unwrap();
            if prefix[0] != FRAME_METHOD {
                continue;
            }
            let channel = be16(&prefix[1..3]);
            let reply = match (be16(&rest[0..2]), be16(&rest[2..4])) {
                (10, 11) => tune_with(131_072, 0),
                (10, 40) => method(0, 10, 41, &short(b"")),
                (20, 10) => method(channel, 20, 11, &long(b"")),
                (60, 20) => {
                    let mut out = method(channel, 60, 21, &short(b"ctag"));
                    let mut deep = deep_tables(10_000);
                    deep = table(&[(b"deep", b'F', deep)]);
                    type Case<'a> = (&'a [u8], Vec<(u8, Vec<u8>)>);
                    let cases: [Case; 4] = [
                        (b"q", vec![(MESSAGE_ID, short(b"good-1"))]),
                        (b"q-\xff", vec![(MESSAGE_ID, short(b"id-\xff")), (HEADERS, table(&[(b"k", b'Z', vec![])]))]),
                        (b"q", vec![(HEADERS, deep), (MESSAGE_ID, short(b"deep"))]),
                        (b"q", vec![(MESSAGE_ID, short(b"good-2"))]),
                    ];
                    for (rk, props) in cases {
                        let mut props = props;
                        props.sort_by_key(|p| std::cmp::Reverse(p.0));
                        let mut a = short(b"ctag");
                        a.extend_from_slice(&1u64.to_be_bytes());
                        a.push(0);
                        a.extend(short(b""));
                        a.extend(short(rk));
                        out.extend(method(channel, 60, 60, &a));
                        out.extend(header(channel, 2, &props));
                        out.extend(body(channel, b"{}"));
                    }
                    out
                }
                (10, 50) => {
                    let _ = s.write_all(&method(0, 10, 51, &[]));
                    return;
                }
                _ => continue,
            };
            s.write_all(&reply).unwrap();
        }
    });
    let url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    let conn = lapin::Connection::connect_with_runtime(&url, lapin::ConnectionProperties::default(), runtime(0, None, Default::default())).await.unwrap();
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume("q".into(), "".into(), lapin::options::BasicConsumeOptions::default(), FieldTable::default())
        .await
        .unwrap();
    let mut got = Vec::new();
    for _ in 0..4 {
        let d = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await.expect("a delivery").unwrap().unwrap();
        let props = &d.properties;
        let mark = props.headers().as_ref().and_then(|h| h.inner().get(MALFORMED_HEADER).cloned());
        got.push((props.message_id().as_ref().map(|s| s.to_string()), d.routing_key.to_string(), mark.is_some()));
    }
    assert_eq!(got[0], (Some("good-1".into()), "q".into(), false));
    assert_eq!(got[1], (Some("id-?".into()), "q-?".into(), true));
    assert_eq!(got[2], (Some("deep".into()), "q".into(), true));
    assert_eq!(got[3], (Some("good-2".into()), "q".into(), false));
    assert!(conn.status().connected());
    let _ = conn.close(200, "OK".into()).await;
    let _ = broker.join();
}
