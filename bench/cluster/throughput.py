#!/usr/bin/env python3
"""Measures TCP throughput from this network namespace to HOST:PORT (a receiver started with
--serve PORT): sends for SECONDS and prints the receiver's count in megabits per second.

  throughput.py --serve PORT            receive one connection, print its Mbit/s
  throughput.py HOST PORT SECONDS       send for SECONDS
"""
import socket
import sys
import time

if sys.argv[1] == "--serve":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", int(sys.argv[2])))
    s.listen(1)
    print("ready", flush=True)
    c, _ = s.accept()
    n, t0 = 0, None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        if t0 is None:
            t0 = time.time()
        n += len(b)
    print(f"{8 * n / (time.time() - t0) / 1e6:.1f}", flush=True)
else:
    host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    c = socket.create_connection((host, port), timeout=10)
    buf = b"x" * (1 << 20)
    end = time.time() + seconds
    while time.time() < end:
        c.sendall(buf)
    c.close()
