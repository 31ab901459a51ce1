import struct, os, sys
root = sys.argv[1]
cap = open(sys.argv[2] if len(sys.argv) > 2 else 'capture.bin', 'rb').read()
def frames(b):
    i = 0; out = []
    while i + 7 <= len(b):
        t, ch, n = struct.unpack('>BHI', b[i:i+7])
        out.append((t, ch, b[i+7:i+7+n])); i += 8 + n
    return out
fs = frames(cap)
print(len(fs), 'frames', [(t, len(p)) for t, _, p in fs][:40])
def frame(t, ch, p): return struct.pack('>BHI', t, ch, len(p)) + p + b'\xce'
def w(target, name, data):
    d = os.path.join(root, target); os.makedirs(d, exist_ok=True)
    open(os.path.join(d, name), 'wb').write(data)
# frame_filter: three control bytes (read sizes, lapin's buffer), then the stream.
w('frame_filter', 'rabbitmq-3.10-session', b'\xff\xff\xff' + cap)
w('frame_filter', 'rabbitmq-3.10-session-small-reads', b'\x00\x02\x01' + cap)
hdrs = [(i, p) for i, (t, ch, p) in enumerate(fs) if t == 2]
def short(s): return bytes([len(s)]) + s
def long_(s): return struct.pack('>I', len(s)) + s
def props_of(p): return p[12:]
def table_of(p):
    flags = struct.unpack('>H', p[12:14])[0]; pos = 14
    kinds = ['s','s','F','o','o','s','s','s','s','T','s','s','s','s']
    for bit, k in zip(range(15, 1, -1), kinds):
        if not flags & (1 << bit): continue
        if k == 's': pos += 1 + p[pos]
        elif k == 'o': pos += 1
        elif k == 'T': pos += 8
        else:
            n = struct.unpack('>I', p[pos:pos+4])[0]
            return p[pos+4:pos+4+n]
    return None
n = 0
for i, p in hdrs:
    deliver = fs[i-1]; body = fs[i+1] if i + 1 < len(fs) and fs[i+1][0] == 3 else (3, 1, b'')
    msg = frame(*deliver) + frame(2, 1, p) + frame(*body)
    w('frame_filter', f'delivery-{n}', b'\xff\xff\xff' + msg)
    w('envelope', f'properties-{n}', props_of(p))
    t = table_of(p)
    if t: w('header_table', f'table-{n}', t)
    w('body', f'body-{n}', b'\x01' + body[2])
    n += 1
# Hostile ones, as docs/hostile-input.md lists them.
def deep(levels):
    inner = b''
    for _ in range(levels): inner = long_(short(b'a') + b'F' + inner)
    return short(b'deep') + b'F' + inner
deep_t = deep(40)
non_utf8_key = short(b'k\xff') + b'S' + long_(b'v')
unknown = short(b'ok') + b'S' + long_(b'1') + short(b'bad') + b'Z' + b'\x00\x01'
overrun = short(b'arr') + b'A' + struct.pack('>I', 3) + b'S' + struct.pack('>I', 99)
for name, t in [('deep-40', deep_t), ('key-not-utf8', non_utf8_key), ('unknown-type', unknown), ('overrun', overrun)]:
    w('header_table', name, t)
    props = struct.pack('>H', 0x8000 | 0x2000 | 0x0100) + short(b'application/json') + long_(t) + short(b'id-\xff')
    w('envelope', name, props)
    w('frame_filter', name, b'\xff\xff\xff' + frame(*fs[hdrs[0][0]-1]) + frame(2, 1, struct.pack('>HHQ', 60, 0, 2) + props) + frame(3, 1, b'{}'))
w('envelope', 'continuation-flags', struct.pack('>HHH', 0x8001, 0x0001, 0x0000) + short(b'application/json'))
for k, b in enumerate([b'{"a":[1,2,{"b":null}]}', b'"\xc3\xa9"', b'{"a":"\xff"}', b'[' * 200, b'1e400', b'{"a":1} x']):
    w('body', f'json-{k}', bytes([k]) + b)
