#!/usr/bin/env bash
# Prints N (default 1) free TCP ports on 127.0.0.1, space separated: the demo and the scale
# benchmark give muster's metrics and webhook servers ports no other process holds.
set -euo pipefail
python3 - "${1:-1}" <<'PY'
import socket, sys
s = [socket.socket() for _ in range(int(sys.argv[1]))]
for x in s:
    x.bind(("127.0.0.1", 0))
print(" ".join(str(x.getsockname()[1]) for x in s))
PY
