"""A moto S3 server on 127.0.0.1:PORT holding BUCKET with the files of SRC under PREFIX.

The objects are put into moto's in-process backend before the server starts listening, so a
restarted server (moto keeps data in memory only) serves the same bucket from its first
request, as a real S3 that went away and came back. Prints "ready" when listening; runs until
killed. Usage: moto_s3.py PORT BUCKET PREFIX SRC
"""
import logging
import os
import sys
import time

from moto.core import DEFAULT_ACCOUNT_ID
from moto.s3.models import s3_backends
from moto.server import ThreadedMotoServer

port, bucket, prefix, src = int(sys.argv[1]), sys.argv[2], sys.argv[3].strip("/"), sys.argv[4]
backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
backend.create_bucket(bucket, "us-east-1")
n = 0
for root, _, files in os.walk(src):
    for f in files:
        path = os.path.join(root, f)
        rel = os.path.relpath(path, src)
        key = f"{prefix}/{rel}" if prefix else rel
        with open(path, "rb") as fh:
            backend.put_object(bucket, key, fh.read())
        n += 1
# werkzeug logs every request at INFO to stderr; only its warnings and errors are worth a line.
logging.getLogger("werkzeug").setLevel(logging.WARNING)
server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
server.start()
print(f"ready {n}", flush=True)
while True:
    time.sleep(3600)
