import socket, threading, sys
out = open(sys.argv[1], 'wb')
ls = socket.socket(); ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind(('127.0.0.1', 5699)); ls.listen(1)
c, _ = ls.accept()
s = socket.create_connection(('127.0.0.1', 5672))
def pump(a, b, log):
    while True:
        d = a.recv(65536)
        if not d:
            try: b.shutdown(socket.SHUT_WR)
            except Exception: pass
            return
        if log: out.write(d); out.flush()
        b.sendall(d)
t1 = threading.Thread(target=pump, args=(c, s, False)); t2 = threading.Thread(target=pump, args=(s, c, True))
t1.start(); t2.start(); t1.join(); t2.join(); out.close()
