#!/usr/bin/env python3
"""The test cluster's DNS (scripts/test-cluster.sh), what CoreDNS's kubernetes plugin answers in a
kind cluster: A records for <service>.<namespace>.svc[.cluster.local] from the API's Services (the
ClusterIP; a headless Service's ready endpoint addresses), read from the API server every second.
Every other name is NXDOMAIN: the pods of the test cluster need no outside name.

  cluster_dns.py --kubeconfig FILE --listen ADDR:PORT [--domain cluster.local]
"""
import argparse
import json
import socket
import ssl
import struct
import sys
import threading
import time
import urllib.request

import yaml


def api_reader(kubeconfig):
    cfg = yaml.safe_load(open(kubeconfig))
    server = cfg["clusters"][0]["cluster"]["server"]
    token = cfg["users"][0]["user"]["token"]
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the test API server's self-signed certificate

    def get(path):
        req = urllib.request.Request(server + path, headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(req, context=ctx, timeout=5) as r:
            return json.load(r)

    return get


def records(get, domain):
    """{fqdn (lower case, no trailing dot): [IPv4 address, ...]} for every Service."""
    endpoints = {}
    for e in get("/api/v1/endpoints")["items"]:
        key = (e["metadata"]["namespace"], e["metadata"]["name"])
        endpoints[key] = [a["ip"] for s in e.get("subsets") or [] for a in s.get("addresses") or []]
    out = {}
    for s in get("/api/v1/services")["items"]:
        ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
        ip = s["spec"].get("clusterIP")
        addrs = endpoints.get((ns, name), []) if ip in (None, "", "None") else [ip]
        for fqdn in (f"{name}.{ns}.svc.{domain}", f"{name}.{ns}.svc"):
            out[fqdn] = addrs
    return out


def answer(query, table):
    """The reply to one DNS query packet, or None for a packet that is not a query."""
    if len(query) < 12:
        return None
    qid, flags, qdcount = struct.unpack(">HHH", query[:6])
    if flags & 0x8000 or qdcount != 1:
        return None
    labels, i = [], 12
    while i < len(query) and query[i] != 0:
        n = query[i]
        labels.append(query[i + 1:i + 1 + n].decode("ascii", "replace"))
        i += 1 + n
    question_end = i + 5
    if question_end > len(query):
        return None
    qtype, qclass = struct.unpack(">HH", query[i + 1:question_end])
    name = ".".join(labels).lower()
    addrs = table.get(name)
    rcode = 0 if addrs is not None else 3  # NXDOMAIN
    answers = [a for a in (addrs or [])] if qtype in (1, 255) and qclass == 1 else []
    header = struct.pack(">HHHHHH", qid, 0x8400 | (flags & 0x0100) | rcode, 1, len(answers), 0, 0)
    body = query[12:question_end]
    for a in answers:
        body += struct.pack(">HHHIH", 0xC00C, 1, 1, 5, 4) + socket.inet_aton(a)
    return header + body


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--listen", required=True, help="ADDR:PORT")
    p.add_argument("--domain", default="cluster.local")
    o = p.parse_args()
    host, port = o.listen.rsplit(":", 1)
    get = api_reader(o.kubeconfig)
    table = {}

    def refresh():
        nonlocal table
        warned = False
        while True:
            try:
                table = records(get, o.domain)
                warned = False
            except Exception as e:  # the API server restarting: keep the last names
                if not warned:
                    print(f"cluster-dns: cannot read the Services ({e}); keeping {len(table)} names", flush=True)
                    warned = True
            time.sleep(1)

    threading.Thread(target=refresh, daemon=True).start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((host, int(port)))
    print(f"cluster-dns: serving {o.domain} on {o.listen}", flush=True)
    while True:
        query, peer = sock.recvfrom(4096)
        reply = answer(query, table)
        if reply:
            sock.sendto(reply, peer)


if __name__ == "__main__":
    sys.exit(main())
