#!/usr/bin/env python3
"""A test's view of an S3-compatible server (moto's), with boto3:

    s3.py make-bucket --endpoint URL --bucket NAME
    s3.py list --endpoint URL --bucket NAME [--prefix P]
    s3.py put --endpoint URL --bucket NAME --key KEY --text TEXT

`list` prints a JSON object: each key under the prefix with its size, the SHA-256 of its bytes (read back with
GET) and its last-modified time, so a test compares the objects with local files without trusting the listing.
Credentials are moto's test ones from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY).
"""

import argparse
import hashlib
import json
import sys

import boto3
from botocore.config import Config


def client(endpoint):
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )


def main():
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["make-bucket", "list", "put"])
    p.add_argument("--endpoint", required=True)
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", default="")
    p.add_argument("--key")
    p.add_argument("--text")
    a = p.parse_args()
    s3 = client(a.endpoint)
    if a.command == "make-bucket":
        s3.create_bucket(Bucket=a.bucket)
        print("{}")
    elif a.command == "put":
        s3.put_object(Bucket=a.bucket, Key=a.key, Body=a.text.encode())
        print("{}")
    else:
        out = {}
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=a.bucket, Prefix=a.prefix):
            for o in page.get("Contents", []):
                body = s3.get_object(Bucket=a.bucket, Key=o["Key"])["Body"].read()
                out[o["Key"]] = {
                    "size": len(body),
                    "sha256": hashlib.sha256(body).hexdigest(),
                    "modified": o["LastModified"].isoformat(),
                }
        json.dump(out, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main()
