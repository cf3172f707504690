"""Creates CONTAINER in a running Azurite (the Azure Blob Storage emulator) and uploads the
files of SRC under PREFIX, signed with Shared Key as the Azure SDKs sign (the emulator's
well-known devstoreaccount1 account), so the tests start from a container another client
wrote. Prints "ready N". Usage: azurite_seed.py ACCOUNT_URL CONTAINER PREFIX SRC
"""
import base64
import hashlib
import hmac
import os
import sys
import urllib.parse
import urllib.request
from email.utils import formatdate

ACCOUNT = "devstoreaccount1"
KEY = base64.b64decode(
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


def send(method, url, body=b"", headers=None):
    headers = dict(headers or {})
    # urllib sends a Content-Type with every body; it is part of what is signed.
    headers["Content-Type"] = "application/octet-stream"
    headers["x-ms-date"] = formatdate(usegmt=True)
    headers["x-ms-version"] = "2021-08-06"
    u = urllib.parse.urlsplit(url)
    canon_headers = "".join(
        f"{k}:{v}\n" for k, v in sorted((k.lower(), v) for k, v in headers.items() if k.lower().startswith("x-ms-"))
    )
    resource = f"/{ACCOUNT}{u.path}"
    for k, v in sorted(urllib.parse.parse_qsl(u.query)):
        resource += f"\n{k.lower()}:{v}"
    length = str(len(body)) if body else ""
    content_type = headers.get("Content-Type", "")
    to_sign = f"{method}\n\n\n{length}\n\n{content_type}\n\n\n\n\n\n\n{canon_headers}{resource}"
    sig = base64.b64encode(hmac.new(KEY, to_sign.encode(), hashlib.sha256).digest()).decode()
    headers["Authorization"] = f"SharedKey {ACCOUNT}:{sig}"
    req = urllib.request.Request(url, data=body if method == "PUT" else None, method=method, headers=headers)
    with urllib.request.urlopen(req) as r:
        return r.status


account_url, container, prefix, src = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3].strip("/"), sys.argv[4]
send("PUT", f"{account_url}/{container}?restype=container")
n = 0
for root, _, files in os.walk(src):
    for f in sorted(files):
        rel = os.path.relpath(os.path.join(root, f), src).replace(os.sep, "/")
        key = f"{prefix}/{rel}" if prefix else rel
        with open(os.path.join(root, f), "rb") as fh:
            body = fh.read()
        send("PUT", f"{account_url}/{container}/{urllib.parse.quote(key)}", body, {"x-ms-blob-type": "BlockBlob"})
        n += 1
print(f"ready {n}", flush=True)
